"""``/api/v1/schedules`` (issue #13): create, list (with next fire times), get (next N
fire times and recent slots with the executions they requested), replace (PUT), change
(PATCH), delete, and pause / resume / fire / backfill. Viewers read; operators change.
A bad cron expression, time zone or duration is a 422 with the one-line reason; each
change is one verb of conveyor.verbs.schedules (one SQL function each)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from conveyor.api.auth import Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.schemas import ErrorOut
from conveyor.store.queries import Q
from conveyor.verbs import schedules as sv
from conveyor.verbs.drive import Verb, run_async

T = TypeVar("T")
router = APIRouter(prefix="/schedules", tags=["schedules"])
Ctx = Annotated[ApiContext, Depends(context)]
WITH_CONFLICT: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    409: {"model": ErrorOut, "description": "a schedule of that name exists already"},
}
Duration = float | str  # seconds, or 30s / 5m / 1h30m
When = datetime | str  # ISO 8601; without an offset: in the schedule's time zone


class ScheduleFields(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cron: str | None = Field(None, max_length=255, description="5 fields, or 6 with seconds first")
    every: Duration | None = Field(None, description="an interval: seconds, or 30s, 5m, 1h30m")
    at: When | None = Field(None, description="one time (a date schedule)")
    timezone: str | None = Field(None, max_length=64, description="IANA name (cron is read in it); default UTC")
    starts: When | None = None
    ends: When | None = None
    action: str | None = Field(None, max_length=255, description="the action requested; none: emit events")
    parameters: dict[str, Any] | None = None
    catchup: str | None = Field(None, pattern="^(skip|latest|all)$")
    catchup_window: Duration | None = None
    overlap: str | None = Field(None, pattern="^(allow|skip|buffer_one|cancel_previous)$")
    description: str | None = Field(None, max_length=4096)

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ScheduleIn(ScheduleFields):
    name: str = Field(max_length=255)


class BackfillIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    since: When
    until: When


class SlotOut(BaseModel):
    schedule: int | None = None
    slot: datetime
    origin: str
    outcome: str
    execution: int | None = None
    event: int | None = None
    error: str | None = None
    fired: datetime
    lag: float | None = None
    execution_status: str | None = None


class ScheduleOut(BaseModel):
    id: int
    name: str
    kind: str
    cron: str | None
    timezone: str
    every: float | None = Field(description="seconds")
    at: datetime | None
    starts: datetime | None
    ends: datetime | None
    action_ref: str | None
    parameters: dict[str, Any]
    trigger: str | None
    catchup: str
    catchup_window: float = Field(description="seconds")
    overlap: str
    paused: bool
    next_fire: datetime | None
    last_slot: datetime | None
    description: str | None
    created: datetime
    updated: datetime
    next_fire_times: list[datetime]
    slots: list[SlotOut] | None = None


class Changed(BaseModel):
    name: str
    id: int
    was_paused: bool


async def _run(ctx: ApiContext, verb: Verb[T]) -> T:
    """A schedule verb on a pool connection: its transaction, its refusals as errors."""
    async with ctx.pool.connection() as conn:
        return await run_async(conn, verb)


@router.post("", response_model=ScheduleOut, status_code=201, responses=WITH_CONFLICT)
async def create(body: ScheduleIn, ctx: Ctx, _: Operator) -> Any:
    """A new schedule (409 if the name is taken): exactly one of cron, every or at."""
    fields = body.given()
    return await _run(ctx, sv.create(fields.pop("name"), fields, replace=False))


@router.get("", response_model=list[ScheduleOut], responses=ERRORS)
async def list_schedules(ctx: Ctx, _: Viewer, limit: Annotated[int, Query(ge=1, le=10_000)] = 500) -> Any:
    """Every schedule by name, with its next fire time."""
    async with ctx.pool.connection() as conn:
        rows = await (await conn.execute(Q["list_schedules"], {"limit": limit})).fetchall()
    return [sv.view(r, count=1) for r in rows]


@router.get("/{name}", response_model=ScheduleOut, responses=ERRORS)
async def get(
    name: str,
    ctx: Ctx,
    _: Viewer,
    next: Annotated[int, Query(ge=0, le=sv.MAX_NEXT)] = 5,
    slots: Annotated[int, Query(ge=0, le=1000)] = 20,
) -> Any:
    """One schedule: its next ``next`` fire times and its ``slots`` most recent slots."""
    return await _run(ctx, sv.read(name, next, slots))


@router.put("/{name}", response_model=ScheduleOut, responses=WITH_BODY)
async def replace(name: str, body: ScheduleFields, ctx: Ctx, _: Operator) -> Any:
    """Create or replace (the slots fired are kept: none fires twice)."""
    return await _run(ctx, sv.create(name, body.given(), replace=True))


@router.patch("/{name}", response_model=ScheduleOut, responses=WITH_BODY)
async def change(name: str, body: ScheduleFields, ctx: Ctx, _: Operator) -> Any:
    """Change the fields given; one of cron/every/at replaces the others."""
    return await _run(ctx, sv.patch(name, body.given()))


@router.delete("/{name}", status_code=204, responses=ERRORS)
async def delete(name: str, ctx: Ctx, _: Operator) -> None:
    await _run(ctx, sv.delete(name))


@router.post("/{name}/pause", response_model=Changed, responses=ERRORS)
async def pause(name: str, ctx: Ctx, _: Operator) -> Any:
    return await _run(ctx, sv.pause(name))


@router.post("/{name}/resume", response_model=Changed, responses=ERRORS)
async def resume(name: str, ctx: Ctx, _: Operator) -> Any:
    """Resume from now: the slots while paused are not fired (backfill them)."""
    return await _run(ctx, sv.resume(name))


@router.post("/{name}/fire", response_model=list[SlotOut], responses=ERRORS)
async def fire(name: str, ctx: Ctx, _: Operator) -> Any:
    """Fire now (origin manual), whatever the overlap policy, even while paused."""
    return await _run(ctx, sv.fire(name))


@router.post("/{name}/backfill", response_model=list[SlotOut], responses=WITH_BODY)
async def backfill(name: str, body: BackfillIn, ctx: Ctx, _: Operator) -> Any:
    """Fire every slot in [since, until) not fired yet (origin backfill); the slots fired now."""
    return await _run(ctx, sv.backfill(name, body.since, body.until))
