"""What happens after an attempt ends: decided here, once, as pure functions.

An attempt ends in one of a few ways (``AttemptEnd``: the ``execution_attempt.outcome``
vocabulary); what the execution does next -- end with that outcome, run again after a
delay, be abandoned, go back to be placed elsewhere -- depends only on how it ended, the
action's policy and its history. Every place that ends attempts (the worker's result,
its shutdown, the recovery sweep, the schedule-to-start monitor, the dead-letter
handler) asks these functions and applies the ``Decision`` with one guarded statement
(``resolve_attempts`` / ``finish``) inside the transaction that holds the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from conveyor.domain.policy import RetryPolicy, WorkerLost, WorkerLostPolicy
from conveyor.domain.status import ExecutionStatus

S = ExecutionStatus


class AttemptEnd(StrEnum):
    """How one attempt ended (``execution_attempt.outcome``)."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # its worker shut down while it ran
    WORKER_LOST = "worker_lost"  # its worker died or lost its standing while it ran
    NOT_PICKED_UP = "not_picked_up"  # scheduled, never started within the schedule-to-start timeout
    EXPIRED = "expired"  # its dispatch was dead-lettered (queue TTL, rejected, redeliveries)


WORKER_LOST_ERROR = "worker lost"
NOT_PICKED_UP_ERROR = "Execution timeout: worker did not pick up task within timeout"
INTERRUPTED_ERROR = "worker shut down"


@dataclass(frozen=True, slots=True)
class Decision:
    """The execution's next status (``requested`` = run again), the delay before it may
    be claimed again (retries), and the attempt's error."""

    status: ExecutionStatus
    delay: float | None = None
    error: str | None = None

    @property
    def again(self) -> bool:
        return self.status is S.REQUESTED


def after_run(end: AttemptEnd, attempt: int, retry: RetryPolicy, error: str | None = None) -> Decision:
    """The action itself ended (completed, failed, timeout) on attempt ``attempt``: a
    failure or timeout runs again if the action's retry policy allows it."""
    if end is AttemptEnd.COMPLETED:
        return Decision(S.COMPLETED, None, error)
    if end not in (AttemptEnd.FAILED, AttemptEnd.TIMEOUT):
        raise ValueError(f"after_run decides completed, failed or timeout, not {end}")
    delay = retry.next_delay(attempt, end.value)
    if delay is None:
        return Decision(S(end.value), None, error)
    return Decision(S.REQUESTED, delay, error)


def cancelled() -> Decision:
    """A cancel was asked (canceling) and the run stopped, or had already ended."""
    return Decision(S.CANCELLED, None, "cancelled")


def on_worker_lost_mode(metadata: Mapping[str, Any] | None, default: WorkerLost) -> WorkerLost:
    mode = (metadata or {}).get("on_worker_lost", default)
    return mode if mode in ("retry", "abandon") else default


def after_interrupted(metadata: Mapping[str, Any] | None, default: WorkerLost) -> Decision:
    """Its worker shut down and stopped it: run again elsewhere at once, or abandoned for
    an action that must not run twice (``on_worker_lost="abandon"``)."""
    if on_worker_lost_mode(metadata, default) == "abandon":
        return Decision(S.ABANDONED, None, INTERRUPTED_ERROR)
    return Decision(S.REQUESTED, None, INTERRUPTED_ERROR)


def after_worker_lost(
    was: ExecutionStatus, lost_before: int, policy: WorkerLostPolicy, metadata: Mapping[str, Any] | None
) -> Decision:
    """Its worker is gone. Being cancelled: cancelled. Running: run again with backoff,
    within the lost-worker budget (``lost_before`` earlier losses), else abandoned."""
    if was is S.CANCELING:
        return Decision(S.CANCELLED, None, f"{WORKER_LOST_ERROR} while cancelling")
    delay = policy.overridden(metadata).next_delay(lost_before + 1)
    if delay is None:
        return Decision(S.ABANDONED, None, WORKER_LOST_ERROR)
    return Decision(S.REQUESTED, delay, WORKER_LOST_ERROR)


def after_missed_dispatch(missed_before: int, reschedules: int, error: str) -> Decision:
    """Scheduled but never started (not picked up in time, or its dispatch dead-lettered):
    placed again, up to ``reschedules`` times, then failed."""
    if missed_before < reschedules:
        return Decision(S.REQUESTED, None, error)
    return Decision(S.FAILED, None, error)
