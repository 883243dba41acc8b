"""The REST API's bodies for triggers, events and enforcements (issue #13)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from conveyor.domain.events import NAME_MAX, NAME_PATTERN
from conveyor.domain.idempotency import MAX_LENGTH, PATTERN


class TriggerIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    payload_schema: dict[str, Any] | None = Field(
        None,
        examples=[{"type": "object", "properties": {"service": {"type": "string"}}, "required": ["service"]}],
        description="a JSON Schema every event's payload must satisfy (checked to be one: 422); null: any JSON",
    )
    description: str | None = Field(None, max_length=10_000)


class TriggerCreate(TriggerIn):
    name: str = Field(..., min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN, examples=["deploys"])


class TriggerOut(BaseModel):
    name: str
    type: str = Field(description="custom, webhook, cron, interval or date")
    payload_schema: dict[str, Any] | None
    description: str | None
    created: datetime
    updated: datetime
    rules: int = Field(description="how many rules use it")
    last_event: datetime | None = Field(description="when its newest event was received")


class TriggerRegistered(TriggerOut):
    created_now: bool = Field(description="true: created; false: an existing trigger updated")


class EventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trigger: str = Field(..., min_length=1, max_length=NAME_MAX, examples=["deploys"])
    payload: Any = Field(default_factory=dict, examples=[{"service": "api", "version": "1.2"}])
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_LENGTH,
        pattern=PATTERN,
        description="a retry with the same key and payload is the same event (also the Idempotency-Key header)",
    )


class EmittedOut(BaseModel):
    id: int
    repeated: bool = Field(description="true: the key was used before with this payload; this is that event")


class EventOut(BaseModel):
    id: int
    trigger: str
    payload: Any
    source: str = Field(description="sql, api, sdk, cli, webhook, schedule or replay")
    received: datetime
    idempotency_key: str | None
    replay_of: int | None = Field(description="the event this one replays")
    pending: bool = Field(description="its rules have not been evaluated yet")


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: int | None = Field(None, description="pass as ?before= for the next page")


class EnforcementOut(BaseModel):
    id: int
    rule: int | None = Field(description="the rule's id (null once the rule is deleted)")
    rule_ref: str
    event: int | None
    outcome: str = Field(description="requested, template_error, request_error or rule_disabled")
    execution: int | None
    parameters: Any
    error: str | None
    created: datetime


class EnforcementPage(BaseModel):
    items: list[EnforcementOut]
    next_cursor: int | None = Field(None, description="pass as ?before= for the next page")


class ReplayRef(BaseModel):
    id: int
    received: datetime


class EventDetail(EventOut):
    enforcements: list[EnforcementOut]
    replays: list[ReplayRef]


class ReplayOut(BaseModel):
    id: int = Field(description="the new event")
    replay_of: int


class ReplayWindowIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trigger: str = Field(..., min_length=1, max_length=NAME_MAX)
    since: AwareDatetime
    until: AwareDatetime | None = Field(None, description="default: the database's now()")


class ReplayPair(BaseModel):
    original: int
    replay: int


class ReplayWindowOut(BaseModel):
    replays: list[ReplayPair]
