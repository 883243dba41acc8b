"""Typed rows of the hot path, and value types turned into query parameters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.actions.registry import ActionDefinition
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.placement import Candidate, Claim, free_capacity
from conveyor.domain.status import ExecutionStatus
from conveyor.store.db import Row


def action_row(definition: ActionDefinition) -> dict[str, Any]:
    """Parameters for the ``upsert_action`` query."""
    row = definition.row()
    row["parameters_schema"] = Jsonb(row["parameters_schema"])
    row["metadata"] = Jsonb(row["metadata"])
    return row


@dataclass(slots=True)
class Decisions:
    """Rows for the ``resolve_attempts`` query."""

    ids: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    delays: list[float | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, row: Row, decision: Decision) -> None:
        self.ids.append(row["id"])
        self.attempts.append(row["attempt"])
        self.statuses.append(decision.status.value)
        self.delays.append(decision.delay)
        self.errors.append(decision.error or "")

    def params(
        self, end: AttemptEnd, *, by: str, from_statuses: Iterable[ExecutionStatus], worker: int | None = None
    ) -> dict[str, Any]:
        return {
            "ids": self.ids,
            "attempts": self.attempts,
            "statuses": self.statuses,
            "delays": self.delays,
            "errors": self.errors,
            "worker": worker,
            "outcome": end.value,
            "by": by,
            "from_statuses": [s.value for s in from_statuses],
        }


@dataclass(frozen=True, slots=True)
class ClaimedExecution:
    """A row of ``claim_requested`` / ``claim_unplaceable``: an execution this executor
    moved to scheduling, with what validation and placement need."""

    id: int
    action_ref: str
    parameters: Any
    runner_type: str
    runtime: str
    parameters_schema: dict[str, Any]
    action_updated: datetime
    age: float  # seconds since requested (database clock)
    avoid: list[int]  # workers that let it time out unstarted before

    def claim(self) -> Claim:
        return Claim(self.id, self.action_ref, self.runner_type, self.runtime, self.age, frozenset(self.avoid))


@dataclass(frozen=True, slots=True)
class LiveWorker:
    """A row of ``live_workers``."""

    id: int
    name: str
    runtimes: list[str]
    actions: list[str]
    capacity: int
    accepting: bool  # active and not cordoned: may be given work
    load: int  # executions on it now (worker_load(): scheduled, running, canceling)
    prefetch: int  # executions it takes beyond its slots (worker.prefetch)

    @property
    def free(self) -> int:
        return free_capacity(self.capacity, self.prefetch, self.load)

    def candidate(self) -> Candidate:
        return Candidate(self.id, self.runtimes, self.actions, self.capacity, self.load, self.accepting, self.prefetch)


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A row of ``claim_scheduled`` / ``unknown_claims``: an attempt this worker now runs."""

    id: int
    attempt: int  # the fencing token every later write quotes
    action_ref: str
    parameters: Any
    runner_type: str
    metadata: dict[str, Any] | None
    since_request: float | None = None  # request -> running (database clock); None for unknown claims

    @property
    def settings(self) -> dict[str, Any]:
        """The action's stored settings (runner options, retry, timeouts)."""
        return self.metadata or {}
