"""Delayed executions (issue #13): the parsing and checks shared by the SDK, the API and
the CLI. A delay is always resolved against the database clock (``now() + interval``),
never this process's: a client's clock may be off by seconds."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from conveyor.domain.errors import ConveyorError

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
# The ceiling of every duration a user types (a delay, an interval, a catch-up window, an
# age to look back or purge): well inside PostgreSQL's interval and timestamptz ranges and
# Python's timedelta, so no door fails on an overflow (99999999999d) instead of saying so.
MAX_DELAY = timedelta(days=3650)
_MAX_SECONDS = MAX_DELAY.total_seconds()


class DelayError(ConveyorError):
    """A delay or a time that cannot be used: said in one line."""


class DurationTooLong(DelayError):
    """A duration beyond :data:`MAX_DELAY` (or not finite)."""


def parse_duration(text: str) -> timedelta:
    """``30s``, ``5m``, ``1h30m``, ``1.5s``, ``250ms``, ``2d``: one or more number+unit parts,
    each unit at most once, largest first."""
    raw = text.strip().lower()
    parts = _PART.findall(raw) if raw else []
    if not parts or "".join(n + u for n, u in parts) != raw:
        raise DelayError(f"--in {text!r}: not a duration; write e.g. 30s, 5m, 1h30m, 250ms (units d h m s ms)")
    units = [u for _, u in parts]
    order = list(_UNITS)
    if len(set(units)) != len(units) or units != sorted(units, key=order.index):
        raise DelayError(f"--in {text!r}: give each unit once, largest first (e.g. 1h30m)")
    seconds = check_seconds(sum(float(n) * _UNITS[u] for n, u in parts), f"--in {text!r}")
    return check_delay(timedelta(seconds=seconds), f"--in {text!r}")


def check_seconds(seconds: float, what: str) -> float:
    """A number of seconds any duration parser may turn into a timedelta or an interval:
    checked before the conversion, which overflows (OverflowError, or PostgreSQL's
    'interval out of range') far beyond the ceiling."""
    if not math.isfinite(seconds) or seconds > _MAX_SECONDS:
        raise DurationTooLong(f"{what}: at most {MAX_DELAY.days} days")
    return seconds


def check_delay(delay: timedelta, what: str = "delay") -> timedelta:
    if delay < timedelta(0):
        raise DelayError(f"{what}: a delay cannot be negative")
    if delay > MAX_DELAY:
        raise DelayError(f"{what}: at most {MAX_DELAY.days} days")
    return delay


def check_aware(when: datetime, what: str = "not_before") -> datetime:
    """A naive datetime means a different instant on every machine: refused."""
    if when.tzinfo is None or when.tzinfo.utcoffset(when) is None:
        raise DelayError(f"{what}: {when.isoformat()} has no UTC offset; give a timezone-aware time")
    return when


def parse_at(text: str) -> datetime:
    """ISO 8601 with a UTC offset (``2026-11-25T12:00:05+00:00``, ``...Z``)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise DelayError(f"--at {text!r}: not an ISO 8601 time; write e.g. 2026-11-25T12:00:05+00:00") from None
    return check_aware(when, f"--at {text!r}")
