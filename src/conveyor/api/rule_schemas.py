"""OpenAPI models of ``/api/v1/rules``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class RuleSummaryOut(BaseModel):
    id: int
    ref: str
    trigger: str
    criteria: dict[str, Any] = Field(..., description="payload checks: {'trigger.path': {type, pattern}}, and/or/not")
    action_ref: str = Field(..., description="the action or workflow requested")
    parameters: dict[str, Any] = Field(..., description="templates rendered from the event")
    enabled: bool
    description: str | None
    created: datetime
    updated: datetime
    enforcements: int | None = Field(None, description="enforcements made (in lists)")


class EnforcementOut(BaseModel):
    id: int
    event: int | None
    outcome: str = Field(..., description="requested | template_error | request_error | rule_disabled")
    execution: int | None
    parameters: dict[str, Any] | None
    error: str | None
    created: datetime


class RuleOut(RuleSummaryOut):
    definition: dict[str, Any] | None = Field(None, description="the document as registered")
    recent: list[EnforcementOut] = Field(..., description="the most recent enforcements, newest first")


class RuleRegistered(BaseModel):
    ref: str
    id: int
    created: bool = Field(..., description="false: an existing rule was updated")


class RuleEnabledOut(BaseModel):
    ref: str
    enabled: bool
    was: bool = Field(..., description="whether it was enabled before")
