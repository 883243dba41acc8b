"""Value types read from the store. Frozen: they are snapshots, the rows are the truth."""

from __future__ import annotations

from collections.abc import Mapping
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
    cancelled_by: str | None = None  # who asked for its cancellation (execution.cancelled_by)
    requested_by: str | None = None  # who requested it (execution.requested_by), if known
    not_before: datetime | None = None  # requested and waiting until then (a delay, a retry's backoff)
    attempts: tuple[Attempt, ...] = field(default=())


# A summary's share of what can be large: the first characters of the parameters' JSON
# text, and of the result's error.
PREVIEW, ERROR_PREVIEW = 200, 300


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    """An execution as lists show it: without its full parameters and result (which can be
    megabytes each); ``Client.get`` and ``GET /api/v1/executions/{id}`` have those."""

    id: int
    action_ref: str
    status: ExecutionStatus
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
    parameters_preview: str  # the first PREVIEW characters of their JSON text
    parameters_truncated: bool  # ... and there is more
    parameters_size: int  # bytes as stored (compressed)
    result_summary: dict[str, JSON] | None  # the result without stdout, stderr and data
    result_size: int | None  # bytes as stored (compressed); None: no result yet
    not_before: datetime | None = None  # requested and waiting until then (a delay, a retry's backoff)


def summary_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an :class:`ExecutionSummary` from an ``api_list_executions`` row."""
    fields = {k: v for k, v in row.items() if k not in ("parameters_head", "error_head")}
    head: str = row["parameters_head"]
    fields["parameters_preview"] = head[:PREVIEW]
    fields["parameters_truncated"] = len(head) > PREVIEW
    summary = row["result_summary"]
    if isinstance(summary, dict) and isinstance(summary.get("error"), str) and len(summary["error"]) > ERROR_PREVIEW:
        summary = {**summary, "error": summary["error"][:ERROR_PREVIEW] + "…"}
    fields["result_summary"] = summary
    return fields


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
    inactive_reason: str | None = None  # why it is inactive (InactiveReason), None while alive
    inactive_since: datetime | None = None
    inactive_age: float | None = None  # seconds since, by the database clock


@dataclass(frozen=True, slots=True)
class ActionResult:
    """The result shape every runner produces (the seeds' system's shape, plus truncation
    flags and the output encodings): every string in it storable (``domain/storable.py``)."""

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
    stdout_encoding: str = "utf-8"  # or "base64": output that is not UTF-8 text, kept exactly
    stderr_encoding: str = "utf-8"
    data_truncated: bool = False  # data is then the first output_limit bytes of its JSON text

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
            "stdout_encoding": self.stdout_encoding,
            "stderr_encoding": self.stderr_encoding,
            "data_truncated": self.data_truncated,
        }
