"""Orquesta's inline forms: ``action: core.echo message="hi <% ctx(x) %>" n=3``,
``publish: a=<% result() %> b=2`` and ``do: a, b``."""

from __future__ import annotations

import json
import re
from typing import Any, Final

_KEY: Final = re.compile(r"([A-Za-z_][\w.-]*)=")
_CLOSERS: Final = {"<%": "%>", "{{": "}}", "{%": "%}"}


class ShorthandError(ValueError):
    pass


def split_action(text: str) -> tuple[str, dict[str, Any]]:
    """``"core.echo a=1 b='x y'"`` -> ``("core.echo", {"a": 1, "b": "x y"})``."""
    stripped = text.strip()
    parts = stripped.split(None, 1)
    if not parts:
        return "", {}
    return parts[0], (pairs(parts[1]) if len(parts) > 1 else {})


def pairs(text: str) -> dict[str, Any]:
    """``key=value`` pairs separated by blanks. A value is quoted ('...' or "..."), or runs
    to the next blank, expressions kept whole whatever blanks they hold. Unquoted values
    that are JSON scalars (``3``, ``true``, ``null``) become those; everything else stays
    text.

    Inside quotes the text is kept as written, backslashes included (Orquesta keeps them:
    ``cmd='printf "x\\ty\\n"'`` runs ``printf "x\\ty\\n"``), except that ``\\'`` (``\\"``)
    puts the quote itself in the value; ``\\\\`` is kept as the two backslashes it is, so
    a value may end in one (``'C:\\\\'``)."""
    out: dict[str, Any] = {}
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return out
        m = _KEY.match(text, at)
        if m is None:
            raise ShorthandError(f"expected key=value at {text[at : at + 30]!r}")
        key = m.group(1)
        value, at = _value(text, m.end())
        if key in out:
            raise ShorthandError(f"{key!r} is given twice")
        out[key] = value


def _value(text: str, at: int) -> tuple[Any, int]:
    if at < len(text) and text[at] in "\"'":
        quote, chars, i = text[at], [], at + 1
        while i < len(text):
            c = text[i]
            if c == "\\" and i + 1 < len(text) and text[i + 1] in (quote, "\\"):
                # The escaped quote alone loses its backslash; a doubled backslash stays
                # whole but is skipped as a pair, so that it does not escape a quote.
                chars.append(text[i + 1] if text[i + 1] == quote else "\\\\")
                i += 2
                continue
            if c == quote:
                end = i + 1
                if end < len(text) and not text[end].isspace():
                    raise ShorthandError(f"text right after the closing quote at {text[at : end + 10]!r}")
                return "".join(chars), end
            chars.append(c)
            i += 1
        raise ShorthandError(f"unterminated quote in {text[at : at + 30]!r}")
    i = at
    while i < len(text) and not text[i].isspace():
        opener = text[i : i + 2]
        if opener in _CLOSERS:
            close = text.find(_CLOSERS[opener], i + 2)
            if close < 0:
                raise ShorthandError(f"{opener} is not closed in {text[at : at + 30]!r}")
            i = close + 2
        else:
            i += 1
    raw = text[at:i]
    return _scalar(raw), i


def _scalar(raw: str) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if value is None or isinstance(value, bool | int | float) else raw


def task_names(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]`` (Orquesta's ``do`` as a string)."""
    return [name.strip() for name in text.split(",") if name.strip()]
