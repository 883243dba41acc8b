"""``/api/v1/events`` and ``/api/v1/enforcements``: emit an event on a custom trigger
(202: the executors evaluate its rules after the commit), list and read events with the
enforcements their rules made, replay one or a trigger's time window. An unknown trigger
is a 404; a payload its schema refuses, or that jsonb cannot store (a NUL character), a
422 naming each path; an idempotency key reused with another payload a 409."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status

from conveyor.api.auth import Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.errors import ClientGoneError
from conveyor.api.event_schemas import (
    EmittedOut,
    EnforcementOut,
    EnforcementPage,
    EventDetail,
    EventIn,
    EventPage,
    ReplayOut,
    ReplayWindowIn,
    ReplayWindowOut,
)
from conveyor.api.routes.executions import ERRORS, WITH_BODY, IdempotencyKey
from conveyor.api.schemas import ErrorOut
from conveyor.domain import events as ev
from conveyor.domain.errors import ConflictError
from conveyor.domain.ids import MAX_ID
from conveyor.store.queries import Q
from conveyor.verbs import events as event_verbs
from conveyor.verbs.drive import run_async

router = APIRouter(prefix="/events", tags=["events"])
enforcements = APIRouter(prefix="/enforcements", tags=["enforcements"])
Ctx = Annotated[ApiContext, Depends(context)]
Since = Annotated[datetime | None, Query(description="at or after (RFC 3339)")]
Before = Annotated[int | None, Query(ge=1, le=MAX_ID, description="cursor: ids below this")]
Limit = Annotated[int, Query(ge=1, le=500)]
EMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    404: {"model": ErrorOut, "description": "unknown trigger"},
    409: {"model": ErrorOut, "description": "the idempotency key was already used with another payload"},
    422: {"model": ErrorOut, "description": "the payload fails the trigger's schema (problems: each path)"},
}


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=EmittedOut, responses=EMIT_ERRORS)
async def emit(body: EventIn, ctx: Ctx, _: Operator, request: Request, key: IdempotencyKey = None) -> dict[str, Any]:
    """Emit an event on ``trigger`` (source ``api``). 202: it is stored; its rules are
    evaluated by the executors. With an idempotency key (in the body or the
    ``Idempotency-Key`` header), a retry with the same key and payload answers the first
    event with ``repeated: true``."""
    if key is not None and body.idempotency_key is not None and key != body.idempotency_key:
        raise ConflictError("the Idempotency-Key header and the body's idempotency_key differ: give one")
    verb = event_verbs.emit(body.trigger, body.payload, "api", body.idempotency_key or key)
    # The verb in a transaction of the route's: not committed for a client that has hung up
    # (it may be retrying without a key).
    async with ctx.pool.connection() as conn, conn.transaction():
        event_id, repeated = await run_async(conn, verb)
        if await request.is_disconnected():
            raise ClientGoneError("POST /api/v1/events")
    return {"id": event_id, "repeated": repeated}


@router.get("", response_model=EventPage, responses=ERRORS)
async def list_events(
    ctx: Ctx,
    _: Viewer,
    trigger: Annotated[str | None, Query(max_length=ev.NAME_MAX)] = None,
    source: Annotated[str | None, Query(max_length=255)] = None,
    since: Since = None,
    until: Annotated[datetime | None, Query(description="before (RFC 3339)")] = None,
    before: Before = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """Newest first; ``next_cursor`` pages (``?before=``)."""
    for text in (trigger, source):
        if text is not None and "\x00" in text:
            return {"items": [], "next_cursor": None}  # no stored name holds a NUL
    params = {"trigger": trigger, "source": source, "since": since, "until": until, "before": before, "limit": limit}
    async with ctx.pool.connection() as conn:
        rows = await (await conn.execute(Q["list_events"], params)).fetchall()
    return {"items": rows, "next_cursor": rows[-1]["id"] if len(rows) == limit else None}


@router.post(
    "/replay",
    status_code=status.HTTP_201_CREATED,
    response_model=ReplayWindowOut,
    responses={**WITH_BODY, 404: {"model": ErrorOut, "description": "unknown trigger"}},
)
async def replay_window(body: ReplayWindowIn, ctx: Ctx, _: Operator) -> dict[str, Any]:
    """Replay every event of ``trigger`` received in [since, until) (until: now), oldest
    first; replays are not replayed again. Answers the (original, replay) pairs."""
    async with ctx.pool.connection() as conn:
        pairs = await run_async(conn, event_verbs.replay_events(body.trigger, body.since, body.until))
    return {"replays": [{"original": original, "replay": replay} for original, replay in pairs]}


@router.get("/{event_id}", response_model=EventDetail, responses=ERRORS)
async def get(event_id: int, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """One event with what its rules decided (``enforcements``: rule_ref, outcome,
    execution, error) and its ``replays``."""
    if not ev.valid_id(event_id):
        raise ev.event_not_found(event_id)
    async with ctx.pool.connection() as conn:
        row = await (await conn.execute(Q["get_event"], {"id": event_id})).fetchone()
        if row is None:
            raise ev.event_not_found(event_id)
        made = await (await conn.execute(Q["event_enforcements"], {"id": event_id})).fetchall()
        replays = await (await conn.execute(Q["event_replays"], {"id": event_id})).fetchall()
    return {**row, "enforcements": made, "replays": replays}


@router.post("/{event_id}/replay", status_code=status.HTTP_201_CREATED, response_model=ReplayOut, responses=ERRORS)
async def replay(event_id: int, ctx: Ctx, _: Operator) -> dict[str, Any]:
    """A new event with this one's trigger and payload (``replay_of``): its rules are
    evaluated again, making new enforcements."""
    async with ctx.pool.connection() as conn:
        new_id = await run_async(conn, event_verbs.replay_event(event_id))
    return {"id": new_id, "replay_of": event_id}


@enforcements.get("", response_model=EnforcementPage, responses=ERRORS)
async def list_enforcements(
    ctx: Ctx,
    _: Viewer,
    rule: Annotated[str | None, Query(max_length=255, description="a rule's ref")] = None,
    event: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    outcome: Annotated[str | None, Query(pattern="^(requested|template_error|request_error|rule_disabled)$")] = None,
    since: Since = None,
    before: Before = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """Newest first; ``next_cursor`` pages (``?before=``)."""
    if rule is not None and "\x00" in rule:
        return {"items": [], "next_cursor": None}
    params = {"rule": rule, "event": event, "outcome": outcome, "since": since, "before": before, "limit": limit}
    async with ctx.pool.connection() as conn:
        rows = await (await conn.execute(Q["list_enforcements"], params)).fetchall()
    return {"items": rows, "next_cursor": rows[-1]["id"] if len(rows) == limit else None}


@enforcements.get("/{enforcement_id}", response_model=EnforcementOut, responses=ERRORS)
async def get_enforcement(enforcement_id: int, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    if not ev.valid_id(enforcement_id):
        raise ev.enforcement_not_found(enforcement_id)
    async with ctx.pool.connection() as conn:
        row = await (await conn.execute(Q["get_enforcement"], {"id": enforcement_id})).fetchone()
    if row is None:
        raise ev.enforcement_not_found(enforcement_id)
    return dict(row)
