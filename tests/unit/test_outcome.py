"""What follows an attempt: the pure decisions of conveyor.domain.outcome."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.domain.outcome import (
    NOT_PICKED_UP_ERROR,
    WORKER_LOST_ERROR,
    AttemptEnd,
    after_interrupted,
    after_missed_dispatch,
    after_run,
    after_worker_lost,
    cancelled,
)
from conveyor.domain.policy import RetryPolicy, WorkerLostPolicy
from conveyor.domain.status import TRANSITIONS, ExecutionStatus

S = ExecutionStatus


def test_a_completed_run_completes_whatever_the_retry_policy() -> None:
    decision = after_run(AttemptEnd.COMPLETED, 1, RetryPolicy(max_attempts=5))
    assert (decision.status, decision.delay, decision.again) == (S.COMPLETED, None, False)


@pytest.mark.parametrize("end", [AttemptEnd.FAILED, AttemptEnd.TIMEOUT])
def test_a_failure_retries_within_the_budget_then_ends_as_itself(end: AttemptEnd) -> None:
    policy = RetryPolicy(max_attempts=3, backoff_base=2.0, backoff_max=10.0)
    first = after_run(end, 1, policy, "boom")
    assert first.status is S.REQUESTED
    assert first.again
    assert first.delay is not None
    assert 1.0 <= first.delay <= 2.0
    assert first.error == "boom"
    last = after_run(end, 3, policy, "boom")
    assert (last.status, last.delay) == (S(end.value), None)


def test_a_retry_policy_can_exclude_timeouts() -> None:
    policy = RetryPolicy(max_attempts=3, retry_on=frozenset({"failed"}))
    assert after_run(AttemptEnd.TIMEOUT, 1, policy).status is S.TIMEOUT
    assert after_run(AttemptEnd.FAILED, 1, policy).status is S.REQUESTED


def test_after_run_refuses_endings_that_are_not_the_actions_own() -> None:
    with pytest.raises(ValueError, match="worker_lost"):
        after_run(AttemptEnd.WORKER_LOST, 1, RetryPolicy())


def test_interrupted_runs_again_unless_the_action_must_not_run_twice() -> None:
    assert after_interrupted({}, "retry").status is S.REQUESTED
    assert after_interrupted({"on_worker_lost": "abandon"}, "retry").status is S.ABANDONED
    assert after_interrupted({}, "abandon").status is S.ABANDONED
    assert after_interrupted({"on_worker_lost": "nonsense"}, "retry").status is S.REQUESTED


def test_a_lost_worker_cancels_what_was_being_cancelled() -> None:
    decision = after_worker_lost(S.CANCELING, 0, WorkerLostPolicy(), None)
    assert (decision.status, decision.error) == (S.CANCELLED, f"{WORKER_LOST_ERROR} while cancelling")


def test_a_lost_worker_reruns_at_once_then_with_backoff_then_abandons() -> None:
    policy = WorkerLostPolicy(max_attempts=3, backoff_base=1.0, backoff_max=60.0)
    assert after_worker_lost(S.RUNNING, 0, policy, None) == after_worker_lost(S.RUNNING, 0, policy, {})
    first = after_worker_lost(S.RUNNING, 0, policy, None)
    assert (first.status, first.delay) == (S.REQUESTED, 0.0)
    second = after_worker_lost(S.RUNNING, 1, policy, None)
    assert second.status is S.REQUESTED
    assert second.delay is not None
    assert 0.5 <= second.delay <= 1.0
    assert after_worker_lost(S.RUNNING, 2, policy, None).status is S.ABANDONED
    assert after_worker_lost(S.RUNNING, 0, policy, {"on_worker_lost": "abandon"}).status is S.ABANDONED


def test_a_missed_dispatch_is_placed_again_a_bounded_number_of_times() -> None:
    assert after_missed_dispatch(0, 2, NOT_PICKED_UP_ERROR).status is S.REQUESTED
    assert after_missed_dispatch(1, 2, NOT_PICKED_UP_ERROR).status is S.REQUESTED
    failed = after_missed_dispatch(2, 2, NOT_PICKED_UP_ERROR)
    assert (failed.status, failed.error) == (S.FAILED, NOT_PICKED_UP_ERROR)


@given(
    end=st.sampled_from([AttemptEnd.COMPLETED, AttemptEnd.FAILED, AttemptEnd.TIMEOUT]),
    attempt=st.integers(1, 20),
    max_attempts=st.integers(1, 20),
    lost=st.integers(0, 20),
    was=st.sampled_from([S.RUNNING, S.CANCELING]),
)
def test_every_decision_is_a_legal_transition(
    end: AttemptEnd, attempt: int, max_attempts: int, lost: int, was: ExecutionStatus
) -> None:
    """From where each decision applies, the status it picks is an edge of the graph (the
    database would refuse anything else)."""
    retry, lost_policy = RetryPolicy(max_attempts=max_attempts), WorkerLostPolicy(max_attempts=max_attempts)
    assert after_run(end, attempt, retry).status in TRANSITIONS[S.RUNNING]
    assert cancelled().status in TRANSITIONS[S.CANCELING]
    assert after_interrupted({}, "retry").status in TRANSITIONS[S.RUNNING]
    assert after_worker_lost(was, lost, lost_policy, None).status in TRANSITIONS[was]
    assert after_missed_dispatch(lost, max_attempts, "x").status in TRANSITIONS[S.SCHEDULED]
