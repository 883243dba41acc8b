"""Retention of finished executions (issue #14): the ages and statuses the settings
(``retention.*``) and ``conveyor executions purge`` accept. The deletion itself is one SQL
function, ``purge_executions`` (migration 0024), which checks its arguments again."""

from __future__ import annotations

import math
import re
from typing import Any

from conveyor.domain.delays import DelayError, check_seconds
from conveyor.domain.errors import ConveyorError
from conveyor.domain.status import TERMINAL_ORDER

# What a purge may take: finished executions only (the status graph's terminal ones).
FINISHED: tuple[str, ...] = tuple(s.value for s in TERMINAL_ORDER)
# "Keep for good" in a setting: YAML null, or one of these words (an environment variable
# cannot say null).
KEEP_FOREVER = frozenset({"", "off", "none", "null", "never", "forever"})

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}


class RetentionError(ConveyorError):
    """An age or a status a purge cannot take: said in one line."""


def parse_age(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w`` (fractions allowed)."""
    match = _AGE.fullmatch(text.strip().lower())
    if match is None:
        raise RetentionError(f"{text!r} is not an age: give seconds (90) or a number with s, m, h, d or w (30d)")
    # The one ceiling of every duration (domain.delays): DurationTooLong, said in one line.
    return check_seconds(float(match.group(1)) * _UNITS[match.group(2)], repr(text))


def retention_seconds(value: Any) -> float | None:
    """A ``retention.<status>`` value: None (kept for good), seconds, or an age text."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("give an age (seconds, or 7d, 12h) or off")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r}: an age is zero or more seconds")
        return float(value)
    if isinstance(value, str):
        if value.strip().lower() in KEEP_FOREVER:
            return None
        try:
            return parse_age(value)
        except (RetentionError, DelayError) as exc:
            raise ValueError(f"{exc}, or off") from None
    raise ValueError(f"{value!r} is not an age")


def check_statuses(statuses: list[str]) -> list[str]:
    """Finished statuses only, each once, in the order given."""
    bad = [s for s in statuses if s not in FINISHED]
    if bad:
        raise RetentionError(f"only finished executions can be purged ({', '.join(FINISHED)}), not {', '.join(bad)}")
    return list(dict.fromkeys(statuses))
