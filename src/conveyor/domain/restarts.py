"""When a supervisor restarts a child that died: at once the first time, then after a
doubling backoff, and not at all past a bound of restarts within a window (a child that
dies in a loop must not be restarted in a loop). Pure: the caller passes the times of the
earlier restarts and the present, on one monotonic clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    limit: int  # restarts allowed within ``window``; 0 = never restart
    window: float  # seconds
    backoff: float  # wait before the second restart within the window; doubles after
    backoff_max: float


def recent_restarts(history: Sequence[float], now: float, window: float) -> list[float]:
    """The restarts that still count: those less than ``window`` seconds ago."""
    return [t for t in history if now - t < window]


def restart_delay(policy: RestartPolicy, history: Sequence[float], now: float) -> float | None:
    """Seconds to wait before restarting now, or None: give up (``policy.limit`` restarts
    were made within the window already)."""
    recent = recent_restarts(history, now, policy.window)
    if len(recent) >= policy.limit:
        return None
    if not recent:
        return 0.0
    return float(min(policy.backoff * 2 ** (len(recent) - 1), policy.backoff_max))
