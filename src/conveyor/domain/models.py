"""Value types read from the store. Frozen: they are snapshots, the rows are the truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.domain.status import ExecutionStatus

JSON = Any


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    worker: int | None
    worker_name: str | None
    scheduled: datetime | None
    started: datetime | None
    ended: datetime | None
    outcome: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Execution:
    id: int
    action_ref: str
    parameters: dict[str, JSON]
    status: ExecutionStatus
    result: JSON
    worker: int | None
    worker_name: str | None
    executor: str | None
    parent: int | None
    enforcement: int | None
    attempt: int
    created: datetime
    updated: datetime
    scheduled: datetime | None
    started: datetime | None
    ended: datetime | None
    attempts: tuple[Attempt, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: int
    name: str
    worker_role: str
    status: str
    runtimes: list[str]
    capacity: int
    load: int
    host: str | None
    pid: int | None
    last_heartbeat: datetime | None
    heartbeat_age: float | None
    created: datetime
    updated: datetime
    cordoned: bool = False
    stale_after: float | None = None


@dataclass(frozen=True, slots=True)
class ActionResult:
    """The result shape every runner produces (the seeds' system's shape, plus truncation flags)."""

    succeeded: bool
    exit_code: int | None
    duration: float
    stdout: str = ""
    stderr: str = ""
    data: JSON = None
    error: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False

    def to_json(self) -> dict[str, JSON]:
        return {
            "succeeded": self.succeeded,
            "exit_code": self.exit_code,
            "duration": round(self.duration, 6),
            "stdout": self.stdout,
            "stderr": self.stderr,
            "data": self.data,
            "error": self.error,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
        }
