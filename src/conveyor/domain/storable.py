"""What an action produced, made storable: PostgreSQL ``text`` and ``jsonb`` hold no NUL
character and no unpaired UTF-16 surrogate, and ``jsonb`` has no NaN or Infinity. An
action can produce all of these; none of them may reach a write (a write that fails on
its data would be retried, or take the worker down, for ever).

- Command output (bytes) is kept exactly: as text when it is UTF-8 without NUL, else as
  base64 of the very bytes, marked by its ``*_encoding`` (``utf-8`` or ``base64``).
- A returned value is stored as JSON when PostgreSQL can hold it, cut to a size limit
  (its JSON text, flagged ``data_truncated``) when it is too big, and otherwise refused
  with the reason (:class:`Unstorable`): the execution fails with that error.
- Text Conveyor writes about a run (errors, tracebacks) is diagnostics: NUL and unpaired
  surrogates are shown as Python-style backslash escapes, and errors are cut to a length.
- What a user gives a door (a workflow or rule definition, a schedule, a webhook, an
  inquiry's answer, an event's payload) is refused when PostgreSQL could not store it
  (:func:`storable_problems`), with the path of each problem, instead of failing in the
  database with a driver error (a traceback in the CLI, a 500 from the API).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterator
from typing import Any

UTF8, BASE64 = "utf-8", "base64"
OUTPUT_LIMIT = 10 * 1024 * 1024  # worker.output_limit's default
ERROR_LIMIT = 8 * 1024  # characters of an error message kept (the full traceback is in stderr)

# A ``\u0000`` escape in JSON text that json.dumps wrote: preceded by an even number of
# backslashes (a literal backslash is written ``\\``, so ``\\u0000`` is text, not a NUL).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class Unstorable(ValueError):
    """A value PostgreSQL cannot store; the message says why, for the execution's error."""


def output_text(raw: bytes, truncated: bool = False) -> tuple[str, str]:
    """Captured output as stored: ``(text, encoding)``. UTF-8 without NUL stays text;
    anything else is base64 of the exact bytes. Output cut at the limit may end inside a
    multi-byte character: that partial character is dropped (the output is flagged
    truncated anyway) rather than turning the whole output into base64."""
    try:
        text = raw.decode(UTF8)
    except UnicodeDecodeError as e:
        if not (truncated and e.end == len(raw) and e.reason == "unexpected end of data"):
            return base64.b64encode(raw).decode("ascii"), BASE64
        return output_text(raw[: e.start])
    if "\x00" in text:
        return base64.b64encode(raw).decode("ascii"), BASE64
    return text, UTF8


def readable(text: str, encoding: str | None) -> str:
    """Stored output for a person: base64 decoded, bytes that are not UTF-8 shown as
    ``\\xNN`` and NUL as ``\\x00`` (what a terminal cannot show faithfully anyway)."""
    if encoding != BASE64:
        return text
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text
    return raw.decode(UTF8, errors="backslashreplace").replace("\x00", "\\x00")


def clean_text(text: str, limit: int | None = None) -> str:
    """Diagnostic text PostgreSQL can store: NUL as ``\\x00``, an unpaired surrogate as
    ``\\udXXX``; longer than ``limit`` characters, cut with a note of the full length."""
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters, cut)"
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode(UTF8)
    except UnicodeEncodeError:
        text = text.encode(UTF8, errors="backslashreplace").decode(UTF8)
    return text


def capped_text(text: str, limit: int) -> tuple[str, bool]:
    """Diagnostic text (see :func:`clean_text`) cut to ``limit`` bytes of UTF-8, as output
    is; True when it was cut."""
    encoded = clean_text(text).encode(UTF8)
    if len(encoded) <= limit:
        return encoded.decode(UTF8), False
    return encoded[:limit].decode(UTF8, errors="ignore"), True


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, storable, even when its ``__str__`` fails."""
    try:
        message = str(exc)
    except Exception:  # an action's exception type may break anything, str() included
        message = "<str() of the exception failed>"
    return clean_text(f"{type(exc).__name__}: {message}" if message else type(exc).__name__, ERROR_LIMIT)


def stored_value(value: Any, limit: int) -> tuple[Any, bool]:
    """A returned value as it will be stored: ``(data, truncated)``.

    ``data`` is the value's JSON form (tuples become lists, int keys strings); when that
    JSON text is over ``limit`` bytes, ``data`` is its first ``limit`` bytes as a string
    and ``truncated`` is True. Raises :class:`Unstorable` when PostgreSQL cannot hold the
    value at all: not JSON (an object, bytes, a set, a cycle, NaN or Infinity, nesting
    too deep), or a string with a NUL character or an unpaired surrogate."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except RecursionError:
        raise Unstorable("it is nested too deeply to convert to JSON") from None
    except (TypeError, ValueError) as e:
        raise Unstorable(f"it has no JSON form ({clean_text(str(e), 500)})") from None
    except Exception as e:  # a subclass of dict, list, str, ... whose methods raise
        raise Unstorable(f"converting it to JSON failed ({describe(e)[:500]})") from None
    try:
        encoded = text.encode(UTF8)
    except UnicodeEncodeError as e:
        code = f"\\u{ord(e.object[e.start]):04x}"
        raise Unstorable(
            f"a string in it contains an unpaired surrogate ({code}), which is not valid Unicode "
            "and which PostgreSQL cannot store"
        ) from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise Unstorable(
            "a string in it contains a NUL character (\\u0000), which PostgreSQL cannot store; "
            "return bytes-like data as base64 or hex text"
        )
    if len(encoded) > limit:
        # Valid UTF-8 cut anywhere: only a partial last character can be dropped here.
        return encoded[:limit].decode(UTF8, errors="ignore"), True
    try:
        return json.loads(text), False
    except RecursionError:  # parsing nests a little deeper than json.dumps did
        raise Unstorable("it is nested too deeply to convert to JSON") from None


def storable_problems(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(path, message)`` for every place in user data (text, or JSON-like data as a door
    parsed it) that PostgreSQL's ``text`` and ``jsonb`` refuse: a NUL character, an
    unpaired surrogate (not UTF-8), in a string or an object's key; NaN or Infinity. The
    path joins keys with dots and indexes with ``[i]`` (``tasks.a.input.x``); one problem
    of a key hides its value's."""
    if isinstance(value, str):
        if "\x00" in value:
            yield path, "contains a NUL character (\\u0000), which cannot be stored"
        elif not value.isascii():
            try:
                value.encode(UTF8)
            except UnicodeEncodeError as e:
                code = f"\\u{ord(value[e.start]):04x}"
                yield path, f"contains an unpaired surrogate ({code}), which is not valid Unicode and cannot be stored"
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, f"{value} is not a JSON number"
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str):
                key_problems = [
                    (f"{path} key {key[:40]!r}" if path else f"key {key[:40]!r}", message)
                    for _, message in storable_problems(key)
                ]
                if key_problems:
                    yield from key_problems
                    continue
            yield from storable_problems(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from storable_problems(item, f"{path}[{index}]")


def unstorable(value: Any, path: str) -> Iterator[str]:
    """:func:`storable_problems` as lines, ``path: message``."""
    for where, message in storable_problems(value, path):
        yield f"{where}: {message}" if where else message
