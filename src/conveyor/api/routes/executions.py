"""``/api/v1/executions``: request (the seeds' ``curl``), list, get, cancel, rerun, and a
server-sent-events stream of changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated, Any

import psycopg
import structlog
from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from conveyor.api import search
from conveyor.api.auth import Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.errors import ClientGoneError
from conveyor.api.schemas import CancelOut, ErrorOut, ExecutionOut, ExecutionPage, ExecutionRequest
from conveyor.api.workflow_schemas import CancelIn, RerunIn
from conveyor.domain.errors import ExecutionNotFoundError
from conveyor.domain.idempotency import MAX_LENGTH, PATTERN
from conveyor.domain.ids import MAX_ID
from conveyor.domain.models import summary_fields
from conveyor.domain.status import ExecutionStatus
from conveyor.store.db import log_operational
from conveyor.store.queries import Q
from conveyor.verbs import executions
from conveyor.verbs.drive import run_async

log = structlog.get_logger(__name__)
router = APIRouter(prefix="/executions", tags=["executions"])
_LOOK_BACK = timedelta(seconds=5)
Ctx = Annotated[ApiContext, Depends(context)]
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "malformed request (e.g. JSON that does not parse)"},
    401: {"model": ErrorOut, "description": "missing, invalid or revoked token"},
    403: {"model": ErrorOut, "description": "the token's role is not enough"},
    404: {"model": ErrorOut, "description": "not found"},
    422: {"model": ErrorOut, "description": "invalid input (the message says what)"},
    503: {"model": ErrorOut, "description": "database unavailable; retry later"},
}
WITH_BODY = {**ERRORS, 413: {"model": ErrorOut, "description": "request body over api.max_body_bytes"}}
CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    200: {
        "model": ExecutionOut,
        "description": "a repeat of an earlier request with this Idempotency-Key: its execution",
    },
    201: {"description": "the execution was created"},
    409: {"model": ErrorOut, "description": "the Idempotency-Key was already used for a different request"},
}
SEARCH_PARAMETERS = (
    'parameters containing these: a JSON object ({"host": "a"}) or key=value pairs (host=a,port=80; a value '
    "that is JSON is read as JSON)"
)
SEARCH_ERROR = "text in the error (case-insensitive)"
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_LENGTH,
        pattern=PATTERN,
        description="a key of the client's choosing (e.g. a UUID): a retry with the same key and body returns "
        "the same execution (200) instead of creating another; kept at least 24 h",
    ),
]


async def get_execution(ctx: ApiContext, eid: int) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        row = await (await conn.execute(Q["get_execution"], {"id": eid})).fetchone()
        if row is None:
            raise ExecutionNotFoundError(eid)
        attempts = await (await conn.execute(Q["get_attempts"], {"id": eid})).fetchall()
        admission = await (await conn.execute(Q["admission_of"], {"id": eid})).fetchone()
    return {**row, "attempts": attempts, "admission": admission}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ExecutionOut, responses=CREATE_RESPONSES)
async def create(
    body: ExecutionRequest,
    ctx: Ctx,
    principal: Operator,
    request: Request,
    response: Response,
    key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Request an execution (``requested``); it is validated against the action's parameter schema.
    With an ``Idempotency-Key``, a retry with the same key and body answers 200 with the
    execution of the first try (for at least 24 h) instead of creating another."""
    verb = executions.request(
        body.action_ref, body.parameters, key=key, by=principal.name, not_before=body.not_before, delay=body.delay
    )
    async with ctx.pool.connection() as conn, conn.transaction():
        eid, repeated = await run_async(conn, verb)  # a savepoint in the transaction of this block
        # Not committed for a client that has hung up (it gave up waiting and may retry):
        # the transaction commits only when this block ends.
        if await request.is_disconnected():
            raise ClientGoneError("POST /api/v1/executions")
    if repeated:
        response.status_code = status.HTTP_200_OK
    return await get_execution(ctx, eid)


@router.get("", response_model=ExecutionPage, responses=ERRORS)
async def list_executions(
    ctx: Ctx,
    _: Viewer,
    status_: Annotated[list[ExecutionStatus] | None, Query(alias="status")] = None,
    action: str | None = None,
    worker: Annotated[str | None, Query(description="worker name")] = None,
    since: Annotated[datetime | None, Query(description="created at or after")] = None,
    until: Annotated[datetime | None, Query(description="created before")] = None,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="cursor: ids below this")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    parameters: Annotated[str | None, Query(max_length=search.MAX_TERM, description=SEARCH_PARAMETERS)] = None,
    error: Annotated[str | None, Query(max_length=search.MAX_TERM, description=SEARCH_ERROR)] = None,
) -> dict[str, Any]:
    """Newest first, as summaries: a preview of the parameters, the result without its
    stdout, stderr and data, and sizes. ``GET /api/v1/executions/{id}`` has them in full.
    A search (``parameters``, ``error``) examines at most 20,000 ids per page: follow
    ``next_cursor`` until it is null to search further back."""
    wanted = search.parse_parameters(parameters)
    term = search.error_term(error)
    params = {
        "statuses": [s.value for s in status_] if status_ else None,
        "action": action,
        "worker": worker,
        "since": since,
        "until": until,
        "before": before,
        "limit": limit,
        "with_result": True,
    }
    async with ctx.pool.connection() as conn:
        floor = await search.window(conn, before, wanted, term)
        params.update(search.search_params(wanted, term, floor))
        rows = await (await conn.execute(Q["api_list_executions"], params)).fetchall()
    items = [summary_fields(r) for r in rows]
    return {"items": items, "next_cursor": search.next_cursor(rows, limit, floor)}


@router.get("/stream", responses=ERRORS, response_class=StreamingResponse)
async def stream(
    request: Request,
    ctx: Ctx,
    _: Viewer,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Server-sent events: an ``execution`` event with an execution's row each time it
    changed (the row is read every ``api.stream_interval``: changes in between come as one
    event with the latest state), from now (or after ``Last-Event-ID``: changes of the 5 s
    before it may come again; the event id names the change), oldest change first; a
    comment line every 15 s keeps proxies from closing the stream."""
    cursor = _parse_cursor(last_event_id)
    sent: dict[tuple[int, datetime], datetime] = {}
    async with ctx.pool.connection() as conn:
        now = (await (await conn.execute(Q["stream_start"])).fetchone())["updated"]
        if cursor is None or cursor[0] > now:  # none, or ahead of the database clock: from now
            cursor = (now, 0)
            # Changes already committed now are history: not sent (the look-back would).
            params = {"updated": cursor[0], "id": cursor[1], "back": cursor[0] - _LOOK_BACK}
            for row in await (await conn.execute(Q["executions_changed_late"], params)).fetchall():
                sent[(row["id"], row["updated"])] = row["updated"]
    interval = ctx.settings.api.stream_interval
    return StreamingResponse(
        _events(request, ctx, cursor, interval, sent),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _parse_cursor(value: str | None) -> tuple[datetime, int] | None:
    if not value:
        return None
    when, _, eid = value.rpartition("|")
    try:
        cursor = datetime.fromisoformat(when), int(eid)
    except ValueError:
        return None
    # Only what this endpoint sends: an aware time (a naive one cannot be compared with the
    # rows'), far enough from datetime.min to look back from, an id PostgreSQL can hold.
    if cursor[0].tzinfo is None or cursor[0].year < 2 or not 0 <= cursor[1] <= MAX_ID:
        return None
    return cursor


async def _events(
    request: Request,
    ctx: ApiContext,
    cursor: tuple[datetime, int],
    interval: float,
    sent: dict[tuple[int, datetime], datetime],
) -> AsyncIterator[str]:
    """Rows are stamped with their transaction's start time, so a transaction that began
    earlier may commit after a later one: each poll looks back ``_LOOK_BACK`` behind the
    cursor and skips (id, updated) pairs already sent."""
    quiet = 0.0
    failing = False
    yield ": stream of execution changes\n\n"
    while not await request.is_disconnected():
        try:
            async with ctx.pool.connection() as conn:
                params = {"updated": cursor[0], "id": cursor[1], "back": cursor[0] - _LOOK_BACK}
                rows = await (await conn.execute(Q["executions_changed"], params)).fetchall()
                rows += await (await conn.execute(Q["executions_changed_late"], params)).fetchall()
            failing = False
        except psycopg.OperationalError as exc:  # the database is away: keep the stream, poll again
            if not failing:
                log_operational(log, "event stream poll", exc)
            failing, rows = True, []
        fresh = [r for r in rows if (r["id"], r["updated"]) not in sent]
        for row in fresh:
            sent[(row["id"], row["updated"])] = row["updated"]
            cursor = max(cursor, (row["updated"], row["id"]))
            data = json.dumps(row, default=_json_default, separators=(",", ":"))
            yield f"id: {row['updated'].isoformat()}|{row['id']}\nevent: execution\ndata: {data}\n\n"
        horizon = cursor[0] - _LOOK_BACK
        sent = {key: when for key, when in sent.items() if when >= horizon}
        if len(fresh) >= 500:
            continue
        quiet = 0.0 if fresh else quiet + interval
        if quiet >= 15:
            quiet = 0.0
            yield ": keepalive\n\n"
        await asyncio.sleep(interval)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


@router.get("/{execution_id}", response_model=ExecutionOut, responses=ERRORS)
async def get(execution_id: int, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    return await get_execution(ctx, valid_id(execution_id))


def valid_id(eid: int) -> int:
    if not 1 <= eid <= MAX_ID:
        raise ExecutionNotFoundError(eid)
    return eid


@router.post("/{execution_id}/cancel", response_model=CancelOut, responses={**ERRORS, 409: {"model": ErrorOut}})
async def cancel(execution_id: int, ctx: Ctx, principal: Operator, body: CancelIn | None = None) -> dict[str, Any]:
    """Not started yet: ``cancelled`` at once. Running: ``canceling``, then ``cancelled`` once
    its worker stopped it (process group killed). Finished: 409. A running workflow is
    ``canceling`` until its children settle: body ``{"policy": "cancel_running"}`` cancels
    them, ``allow_finish`` (the default) lets them finish."""
    eid = valid_id(execution_id)
    policy = body.policy if body else None

    verb = lambda: executions.cancel(eid, principal.name, policy)  # noqa: E731 (run again after a deadlock)
    async with ctx.pool.connection() as conn:
        now = await run_async(conn, verb, retries=ctx.settings.database.verb_retries)
    return {"id": eid, "status": now}


@router.post(
    "/{execution_id}/rerun",
    status_code=status.HTTP_201_CREATED,
    response_model=ExecutionOut,
    responses={**ERRORS, 409: {"model": ErrorOut}},
)
async def rerun(execution_id: int, ctx: Ctx, principal: Operator, body: RerunIn | None = None) -> dict[str, Any]:
    """A new execution of the same action with the same parameters. With body
    ``{"from_failed": true}``, a failed (or cancelled) workflow from its failed tasks,
    keeping the results of the tasks that completed (409 if it has not failed)."""
    eid = valid_id(execution_id)
    from_failed = body is not None and body.from_failed
    verb = executions.rerun(eid, from_failed=from_failed, by=principal.name, requested_by=principal.name)
    async with ctx.pool.connection() as conn:
        new_id = await run_async(conn, verb)
    return await get_execution(ctx, new_id)
