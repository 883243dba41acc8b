"""Idempotency keys: a client sends the same key when it retries a request, and gets the
execution of the first try instead of a second one (see migration 0010)."""

from __future__ import annotations

import re

from conveyor.domain.errors import ConveyorError

MAX_LENGTH = 255
# Printable ASCII without surrounding spaces: what an HTTP header carries unchanged (a
# proxy or client may strip the spaces around a header value, or mangle non-ASCII).
PATTERN = r"^[!-~]([ -~]*[!-~])?$"
_KEY = re.compile(PATTERN)


class InvalidIdempotencyKeyError(ConveyorError):
    pass


def check_idempotency_key(key: str | None) -> str | None:
    """``key`` if it is a usable idempotency key (or None: no key); else the error says why."""
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_LENGTH or _KEY.fullmatch(key) is None:
        shown = repr(key[:64]) + ("..." if len(key) > 64 else "") if isinstance(key, str) else type(key).__name__
        raise InvalidIdempotencyKeyError(
            f"invalid idempotency key {shown}: use 1 to {MAX_LENGTH} printable ASCII characters, "
            "not starting or ending with a space (a UUID is a good key)"
        )
    return key
