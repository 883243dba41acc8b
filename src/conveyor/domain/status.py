"""Execution and worker statuses and the one transition graph.

The graph is written down here. Migration 0001 stores the same edges in the
``execution_transition`` table, which a trigger consults on every UPDATE, so the
database refuses an illegal transition whatever code path attempts it; a unit
test asserts the two agree. The terminal statuses are the SQL function
``terminal_statuses()`` on the database's side (migration 0037), which every query and
function asking "has it ended?" uses; a test asserts it equals ``TERMINAL_ORDER``.
"""

from __future__ import annotations

from enum import StrEnum


class ExecutionStatus(StrEnum):
    REQUESTED = "requested"
    SCHEDULING = "scheduling"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    PENDING = "pending"  # an inquiry waits for its answer (no worker slot)
    PAUSED = "paused"  # a workflow paused by an operator (no worker slot)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELING = "canceling"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    ABANDONED = "abandoned"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


class WorkerStatus(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    INACTIVE = "inactive"


class InactiveReason(StrEnum):
    """Why a worker is inactive (``worker.inactive_reason``, migration 0030)."""

    STOPPED = "stopped"  # its own graceful shutdown
    PROCESS_GONE = "process_gone"  # lock gone, no session of its process left: it died
    LOCK_LOST = "lock_lost"  # lock gone past its lock_grace, its process's other sessions alive
    HEARTBEAT_STALE = "heartbeat_stale"  # heartbeat older than its stale_after, or never sent


S = ExecutionStatus

# In the order messages list them (a purge's refusal, retention's settings).
TERMINAL_ORDER: tuple[ExecutionStatus, ...] = (S.COMPLETED, S.FAILED, S.TIMEOUT, S.CANCELLED, S.ABANDONED)
TERMINAL: frozenset[ExecutionStatus] = frozenset(TERMINAL_ORDER)

# Back-edges to REQUESTED: a claim handed back (no capacity, stale claim reclaimed),
# a dispatch lost before start, a worker lost mid-run with a retry allowed.
TRANSITIONS: dict[ExecutionStatus, frozenset[ExecutionStatus]] = {
    S.REQUESTED: frozenset({S.SCHEDULING, S.CANCELLED}),
    # -> RUNNING: a workflow starts in the executor; -> PENDING: an inquiry is asked.
    S.SCHEDULING: frozenset({S.SCHEDULED, S.REQUESTED, S.FAILED, S.CANCELLED, S.RUNNING, S.PENDING}),
    S.SCHEDULED: frozenset({S.RUNNING, S.REQUESTED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.TIMEOUT, S.CANCELING, S.REQUESTED, S.ABANDONED, S.PAUSED}),
    S.PENDING: frozenset({S.COMPLETED, S.FAILED, S.TIMEOUT, S.CANCELLED}),
    S.PAUSED: frozenset({S.RUNNING, S.CANCELING, S.CANCELLED}),
    S.CANCELING: frozenset({S.CANCELLED, S.ABANDONED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMEOUT: frozenset(),
    S.ABANDONED: frozenset(),
}

# Statuses in which an execution occupies a slot on its worker.
ON_WORKER: frozenset[ExecutionStatus] = frozenset({S.SCHEDULED, S.RUNNING, S.CANCELING})


def can_transition(source: ExecutionStatus, target: ExecutionStatus) -> bool:
    return target in TRANSITIONS[source]


def edges() -> set[tuple[str, str]]:
    return {(str(a), str(b)) for a, targets in TRANSITIONS.items() for b in targets}
