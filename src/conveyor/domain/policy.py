"""Retry and recovery policy: pure decisions, unit-tested alone.

Two budgets are kept apart. The *retry policy* is about the action's own outcome
(failed, timeout) and defaults to no retry. The *worker-lost policy* is about the
platform losing the worker mid-run; it defaults to running again (at-least-once),
bounded so a job that kills its workers cannot kill them in a loop.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

WorkerLost = Literal["retry", "abandon"]


def backoff(retry_number: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: ``base * 2**(n-1)`` capped at ``cap``, then scaled
    by a random factor in [0.5, 1] so that many retries do not land at once."""
    if retry_number < 1 or base <= 0:
        return 0.0
    ceiling = min(cap, base * 2.0 ** (retry_number - 1))
    draw = rng.random() if rng is not None else random.random()
    return ceiling * (0.5 + 0.5 * draw)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    retry_on: frozenset[str] = frozenset({"failed", "timeout"})

    def next_delay(self, attempt: int, outcome: str) -> float | None:
        """Seconds before another attempt after ``attempt`` ended with ``outcome``; None: no retry."""
        if outcome not in self.retry_on or attempt >= self.max_attempts:
            return None
        return backoff(attempt, self.backoff_base, self.backoff_max)

    def overridden(self, override: Mapping[str, Any] | None) -> RetryPolicy:
        if not override:
            return self
        return RetryPolicy(
            max_attempts=int(override.get("max_attempts", self.max_attempts)),
            backoff_base=float(override.get("backoff_base", self.backoff_base)),
            backoff_max=float(override.get("backoff_max", self.backoff_max)),
            retry_on=frozenset(override.get("retry_on", self.retry_on)),
        )


@dataclass(frozen=True, slots=True)
class WorkerLostPolicy:
    on_worker_lost: WorkerLost = "retry"
    max_attempts: int = 3
    backoff_base: float = 1.0
    backoff_max: float = 60.0

    def next_delay(self, lost_so_far: int) -> float | None:
        """Seconds before running again after the worker was lost for the ``lost_so_far``-th
        time (this one included); None: abandon. The first re-run is immediate."""
        if self.on_worker_lost == "abandon" or lost_so_far >= self.max_attempts:
            return None
        return backoff(lost_so_far - 1, self.backoff_base, self.backoff_max)

    def overridden(self, metadata: Mapping[str, Any] | None) -> WorkerLostPolicy:
        metadata = metadata or {}
        mode = metadata.get("on_worker_lost", self.on_worker_lost)
        if mode not in ("retry", "abandon"):
            mode = self.on_worker_lost
        return WorkerLostPolicy(
            on_worker_lost=mode,
            max_attempts=int(metadata.get("worker_lost_max_attempts", self.max_attempts)),
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
        )
