"""Request and response bodies (and so the OpenAPI document)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from conveyor.actions.registry import AdmissionPolicy
from conveyor.api.from_domain import model_of
from conveyor.domain.delays import MAX_DELAY, DelayError, check_delay, parse_duration
from conveyor.domain.models import Attempt, Execution, ExecutionSummary


class ExecutionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action_ref: str = Field(..., min_length=1, max_length=255, examples=["core.echo"])
    parameters: dict[str, Any] = Field(default_factory=dict, examples=[{"message": "test"}])
    # AwareDatetime: a time without an offset is refused (422), not guessed at.
    not_before: AwareDatetime | None = Field(
        None,
        examples=["2026-11-25T12:00:05+00:00"],
        description="RFC 3339 with a UTC offset: it waits in 'requested' until then (a past time means now)",
    )

    @field_validator("not_before", mode="before")
    @classmethod
    def _a_string(cls, value: Any) -> Any:
        # pydantic would take a number for a Unix time: RFC 3339 text only.
        if value is not None and not isinstance(value, str):
            raise ValueError("give RFC 3339 text with a UTC offset, e.g. 2026-11-25T12:00:05+00:00")
        return value

    # (issue #13) Or a delay from the database's now(): seconds, or a duration like "30s".
    delay: timedelta | None = Field(
        None,
        examples=["30s"],
        description="seconds (a number) or a duration (30s, 5m, 1h30m, 250ms): it waits in 'requested' until "
        "the database's now() plus this; not with not_before",
    )

    @field_validator("delay", mode="before")
    @classmethod
    def _a_duration(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise DelayError("give seconds (a number) or a duration such as 30s, 5m, 1h30m")
            if isinstance(value, str):
                return parse_duration(value)
            if not math.isfinite(value):
                raise DelayError(f"{value} is not a number of seconds")
            return check_delay(timedelta(seconds=value), "delay")
        except DelayError as exc:
            raise ValueError(str(exc).replace("--in ", "delay ")) from None
        except OverflowError:
            raise ValueError(f"delay {value}: at most {MAX_DELAY.days} days") from None

    @model_validator(mode="after")
    def _one_time(self) -> ExecutionRequest:
        if self.not_before is not None and self.delay is not None:
            raise ValueError("give not_before or delay, not both")
        return self


class AdmissionOut(BaseModel):
    """Where an execution stands in admission while a policy holds it."""

    state: Literal["holding", "waiting"]
    policy: str = Field(..., description="the target of the policy that governs it")
    group_key: dict[str, Any] = Field(..., description="its group: the values of the policy's parameters")
    seq: int = Field(..., description="its place in the group's request order")
    since: datetime = Field(..., description="when it took its slot, or began to wait")
    ahead: int = Field(..., description="waiting: requests of its group before it (0 when holding)")


# The execution record, as conveyor.domain.models has it (the one list of its fields); the
# API shows its status as text, its result and attempts as optional, and where admission
# holds it.
if TYPE_CHECKING:
    # Fields made at run time are not the type checker's to see: to it these are plain
    # models (only ever response models, never read as objects).
    class AttemptOut(BaseModel): ...

    class ExecutionOut(BaseModel): ...

    class ExecutionSummaryOut(BaseModel): ...

else:
    AttemptOut = model_of(Attempt, "AttemptOut")
    ExecutionOut = model_of(
        Execution,
        "ExecutionOut",
        types={"status": str, "attempts": list[AttemptOut] | None},
        defaults={"result": None, "attempts": None},
        extra={"admission": (AdmissionOut | None, Field(None, description="set while an admission policy holds it"))},
    )
    ExecutionSummaryOut = model_of(
        ExecutionSummary,
        "ExecutionSummaryOut",
        types={"status": str},
        defaults={"result_summary": None, "result_size": None},
        doc="""An execution in a list: its parameters and result can be megabytes each, so a
        summary carries a preview and sizes; ``GET /api/v1/executions/{id}`` has them in full.""",
    )


class ExecutionPage(BaseModel):
    items: list[ExecutionSummaryOut]
    next_cursor: int | None = Field(None, description="pass as `before` for the next (older) page")


class CancelOut(BaseModel):
    id: int
    status: str


class ActionOut(BaseModel):
    ref: str
    pack: str
    name: str
    description: str
    runner_type: str
    runtime: str
    parameters_schema: dict[str, Any]
    metadata: dict[str, Any]


class WorkerOut(BaseModel):
    id: int
    name: str
    worker_role: str
    status: str
    cordoned: bool
    runtimes: list[str]
    capacity: int
    load: int
    host: str | None
    pid: int | None
    last_heartbeat: datetime | None
    heartbeat_age: float | None
    stale_after: float | None
    created: datetime
    updated: datetime
    inactive_reason: str | None = Field(
        None, description="why it is inactive: stopped, process_gone, lock_lost or heartbeat_stale (None while alive)"
    )
    inactive_since: datetime | None = None
    inactive_age: float | None = Field(None, description="seconds since inactive_since (database clock)")


class WorkerChange(BaseModel):
    name: str
    status: str
    cordoned: bool | None = None
    handed_back: int | None = None


class DeadLetterOut(BaseModel):
    id: int
    message_id: str | None
    transport: str
    queue: str
    routing_key: str
    reason: str
    message_type: str | None
    execution: int | None
    attempt: int | None
    worker: int | None
    deliveries: int
    first_seen: datetime
    resolution: str | None
    resolved: datetime | None
    detail: str | None
    error: str | None
    payload: dict[str, Any] | None = None


class ReplayOut(BaseModel):
    id: int
    resolution: str


class PurgeOut(BaseModel):
    deleted: int


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=200)
    role: str = Field(..., pattern="^(viewer|operator|admin)$")


class TokenOut(BaseModel):
    id: int
    name: str
    role: str
    prefix: str
    created: datetime
    last_used: datetime | None = None
    revoked: datetime | None = None


class TokenCreated(TokenOut):
    token: str = Field(..., description="shown once; store it now")


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(..., ge=1, le=2**31 - 1, strict=True, description="executions allowed at once")
    parameters: list[str] = Field(default_factory=list, description="parameters whose values each get their own limit")
    method: Literal["enqueue", "cancel"] = Field(
        "enqueue", description="beyond the limit: wait in request order, or be cancelled at once"
    )

    @model_validator(mode="after")
    def _checked(self) -> PolicyIn:
        AdmissionPolicy(self.concurrency, tuple(self.parameters), self.method)  # the rules of action(policy=...)
        return self


class PolicyOut(BaseModel):
    target: str
    scope: Literal["action", "pack", "global"]
    concurrency: int
    parameters: list[str]
    method: Literal["enqueue", "cancel"]
    source: Literal["metadata", "operator"] = Field(..., description="the action's definition, or an operator")
    created: datetime
    updated: datetime
    held: int = Field(..., description="slots held now")
    waiting: int = Field(..., description="executions waiting now")


class PolicyDeleted(BaseModel):
    target: str
    source: Literal["metadata", "operator"]
    released: int = Field(..., description="executions that were waiting and now may be scheduled")
    restored: PolicyOut | None = Field(None, description="the action's own policy, back in force")


class InquiryResponseOut(BaseModel):
    responder: str
    role: str | None = Field(None, description="the responder's role when it answered (none: the ttl's default)")
    data: Any
    created: datetime


class InquiryOut(BaseModel):
    id: int
    execution: int = Field(..., description="the asking execution (core.ask)")
    status: Literal["pending", "responded", "timeout", "cancelled"]
    prompt: str
    schema_: dict[str, Any] = Field(..., alias="schema", description="JSON Schema of the answer")
    assignees: list[str] = Field(..., description="token names and/or roles; none: any operator")
    quorum: int
    forbid_requester: bool
    requester: str | None
    ttl: float | None
    deadline: datetime | None
    on_timeout: Any
    response: Any = None
    responded: datetime | None
    responders: list[str] = Field(..., description="who answered so far")
    parent: int | None = Field(None, description="the asking execution's parent (a workflow), if any")
    created: datetime
    updated: datetime
    responses: list[InquiryResponseOut] | None = Field(None, description="the audit (GET by id only)")

    model_config = ConfigDict(populate_by_name=True)


class InquiryPage(BaseModel):
    items: list[InquiryOut]
    next_cursor: int | None = Field(None, description="pass as ?before= for the next page")


class RespondIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: Any = Field(..., description="the answer, valid against the inquiry's schema", examples=[{"approved": True}])


class RespondOut(BaseModel):
    id: int
    outcome: Literal["answered", "recorded"] = Field(
        ..., description="answered: the inquiry is responded; recorded: more responders are needed"
    )
    status: str = Field(..., description="the inquiry's status now")
    execution: int
    responders: list[str]


class ErrorOut(BaseModel):
    error: str
