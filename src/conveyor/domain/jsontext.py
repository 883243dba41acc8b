"""Strict JSON text, as RFC 8259, PostgreSQL's jsonb and the API take it.

Python's json module accepts NaN and Infinity and turns 1e400 into inf; none of them can
be stored or sent on, so every door that reads JSON a user or a peer typed refuses them
here, with the offending text, instead of failing later in the database or a client."""

from __future__ import annotations

import json
import math
from typing import Any


class NotFinite(ValueError):
    """A number JSON cannot carry (NaN, Infinity, or beyond a double's range)."""


def no_constant(text: str) -> Any:
    raise NotFinite(text)


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise NotFinite(text)
    return value


def loads(raw: str | bytes) -> Any:
    """``json.loads`` refusing what JSON cannot carry (``NotFinite``, a ValueError)."""
    return json.loads(raw, parse_constant=no_constant, parse_float=finite_float)
