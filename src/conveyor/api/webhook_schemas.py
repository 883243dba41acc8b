"""The REST API's webhook bodies (``/api/v1/webhooks``). Secrets are write-only: a
webhook is shown with whether its secret or token is set, never the value."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class WebhookIn(BaseModel):
    """A webhook to create or update. ``auth``: ``hmac`` (``secret``, or
    ``generate_secret``: a new one, answered once), ``bearer`` (``token``: kept only as its
    SHA-256) or ``none``. On update, an omitted secret or token keeps the one stored."""

    model_config = ConfigDict(extra="forbid")

    auth: Literal["none", "bearer", "hmac"]
    trigger: str | None = Field(None, min_length=1, max_length=255, description="default: the webhook's name")
    secret: str | None = Field(None, min_length=1, max_length=1024, description="HMAC secret (write-only)")
    generate_secret: bool = Field(False, description="generate an HMAC secret, answered once as `secret`")
    token: str | None = Field(None, min_length=1, max_length=1024, description="bearer token (write-only)")
    signature_header: str | None = Field(None, min_length=1, max_length=255, examples=["X-Hub-Signature-256"])
    signature_prefix: str | None = Field(None, max_length=64, examples=["sha256="])
    idempotency_header: str | None = Field(None, min_length=1, max_length=255, examples=["X-GitHub-Delivery"])
    max_body_bytes: int | None = Field(None, ge=1, le=67108864)
    description: str | None = Field(None, max_length=4096)
    payload_schema: dict[str, Any] | None = Field(
        None, description='JSON Schema of the event payload {"body": ..., "headers": {...}}'
    )


class WebhookOut(BaseModel):
    name: str
    trigger: str
    auth: str
    secret_set: bool
    token_set: bool
    signature_header: str
    signature_prefix: str
    idempotency_header: str
    max_body_bytes: int
    enabled: bool
    description: str | None
    payload_schema: dict[str, Any] | None
    created: datetime
    updated: datetime
    events: int = Field(..., description="events this webhook has emitted")
    last_event: datetime | None
    url: str = Field(..., description="the door's path: POST here")


class WebhookSaved(WebhookOut):
    created_now: bool = Field(..., description="true: created; false: updated")
    secret: str | None = Field(None, description="the generated HMAC secret, shown only in this answer")


class WebhookDeleted(BaseModel):
    name: str
    deleted: bool


class WebhookEnabled(BaseModel):
    name: str
    enabled: bool
    was: bool


class WebhookAccepted(BaseModel):
    event_id: int
    trigger: str
    repeated: bool = Field(..., description="a sender's retry (same idempotency key): the first event")


class WebhookRefusal(BaseModel):
    error: str
    problems: list[dict[str, str]] | None = None
