"""Value types read from the store. Frozen: they are snapshots, the rows are the truth."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.domain.status import ExecutionStatus

JSON = Any


def _doc(description: str) -> dict[str, str]:
    """A field's description, as the API's document gives it (``api.from_domain``)."""
    return {"description": description}


_NOT_BEFORE = "requested: not placed before this time (a delay or a retry's backoff)"


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
    # The descriptions are the API document's (conveyor.api.from_domain derives its models).
    cancelled_by: str | None = field(default=None, metadata=_doc("who asked for its cancellation, if anyone did"))
    requested_by: str | None = field(
        default=None, metadata=_doc("who requested it (a token's name, a CLI user), if known")
    )
    not_before: datetime | None = field(default=None, metadata=_doc(_NOT_BEFORE))
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
    parameters_preview: str = field(metadata=_doc(f"the first {PREVIEW} characters of the parameters' JSON text"))
    parameters_truncated: bool = field(metadata=_doc("the parameters' JSON text is longer than the preview"))
    parameters_size: int = field(metadata=_doc("bytes the parameters take as stored (compressed)"))
    result_summary: dict[str, JSON] | None = field(
        metadata=_doc(f"the result without stdout, stderr and data (error cut to {ERROR_PREVIEW} characters)")
    )
    result_size: int | None = field(metadata=_doc("bytes the result takes as stored (compressed); null: none yet"))
    not_before: datetime | None = field(default=None, metadata=_doc(_NOT_BEFORE))


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
