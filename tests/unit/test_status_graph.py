"""Pure unit tests: the execution status transition graph. No database, no processes."""

from __future__ import annotations

from collections import deque

import pytest

from conveyor.domain.status import (
    ON_WORKER,
    TERMINAL,
    TRANSITIONS,
    ExecutionStatus,
    can_transition,
    edges,
)

S = ExecutionStatus

# ---------------------------------------------------------------------------
# The transition graph
# ---------------------------------------------------------------------------


def test_every_status_has_an_entry_in_the_graph() -> None:
    assert set(TRANSITIONS) == set(ExecutionStatus)
    for targets in TRANSITIONS.values():
        assert targets <= set(ExecutionStatus)


def test_terminal_statuses_have_no_exits() -> None:
    assert {S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.ABANDONED} == TERMINAL
    for status in TERMINAL:
        assert status.is_terminal
        assert TRANSITIONS[status] == frozenset()
        assert not any(can_transition(status, target) for target in ExecutionStatus)


def test_non_terminal_statuses_have_exits() -> None:
    for status in set(ExecutionStatus) - TERMINAL:
        assert not status.is_terminal
        assert TRANSITIONS[status], f"{status} is a dead end but not terminal"


def test_every_status_is_reachable_from_requested() -> None:
    seen = {S.REQUESTED}
    queue = deque([S.REQUESTED])
    while queue:
        for nxt in TRANSITIONS[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    assert seen == set(ExecutionStatus)


def test_every_non_terminal_status_can_reach_a_terminal_one() -> None:
    """Nothing can be stuck forever by construction of the graph."""
    for start in ExecutionStatus:
        seen, queue = {start}, deque([start])
        while queue:
            for nxt in TRANSITIONS[queue.popleft()]:
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        assert seen & TERMINAL, f"no terminal status reachable from {start}"


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        (S.REQUESTED, S.SCHEDULING, True),
        (S.REQUESTED, S.CANCELLED, True),
        (S.REQUESTED, S.SCHEDULED, False),  # must be claimed first
        (S.REQUESTED, S.RUNNING, False),
        (S.SCHEDULING, S.SCHEDULED, True),
        (S.SCHEDULING, S.REQUESTED, True),  # claim handed back
        (S.SCHEDULED, S.RUNNING, True),
        (S.SCHEDULED, S.REQUESTED, True),  # dispatch lost before start
        (S.SCHEDULED, S.COMPLETED, False),
        (S.RUNNING, S.COMPLETED, True),
        (S.RUNNING, S.REQUESTED, True),  # worker lost mid-run, retry allowed
        (S.RUNNING, S.SCHEDULED, False),
        (S.RUNNING, S.CANCELLED, False),  # through canceling
        (S.CANCELING, S.CANCELLED, True),
        (S.CANCELING, S.RUNNING, False),
        (S.COMPLETED, S.REQUESTED, False),
        (S.FAILED, S.RUNNING, False),
        (S.REQUESTED, S.REQUESTED, False),  # not an edge (the DB treats a same-status write as no change)
    ],
)
def test_can_transition(source: ExecutionStatus, target: ExecutionStatus, allowed: bool) -> None:
    assert can_transition(source, target) is allowed


def test_edges_match_transitions() -> None:
    expected = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges() == expected
    assert all(isinstance(a, str) and isinstance(b, str) for a, b in edges())
    assert len(edges()) == 28  # 18 for actions on workers, 10 for workflows and inquiries (0012)


def test_on_worker_statuses() -> None:
    assert {S.SCHEDULED, S.RUNNING, S.CANCELING} == ON_WORKER
    assert not (ON_WORKER & TERMINAL)
