"""``/api/v1/executions/{id}/output``: an execution's live output (issue #15), as a page of
chunks or as server-sent events that resume from ``Last-Event-ID``.

A chunk is bytes as the action wrote them (``execution_output``, migration 0029); here it
is ``data`` with its ``encoding``: ``utf-8`` text, or ``base64`` of the exact bytes when they
are not UTF-8 text or hold a NUL (as the result's stdout and stderr are stored).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import psycopg
import structlog
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from conveyor.api.auth import Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, valid_id
from conveyor.domain.errors import ExecutionNotFoundError
from conveyor.domain.ids import MAX_ID
from conveyor.domain.storable import output_text
from conveyor.store.db import log_operational
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)
router = APIRouter(prefix="/executions", tags=["executions"])
Ctx = Annotated[ApiContext, Depends(context)]
_PAGE = 1000
# How often a stream reads new chunks while its execution runs: at most this much is added
# to the worker's own worker.output_interval between a print and a screen (one indexed read
# per open stream per tick; api.stream_interval when that is shorter).
_TICK = 0.2
_KEEPALIVE = 15.0


class OutputChunkOut(BaseModel):
    id: int
    attempt: int
    stream: str
    encoding: str
    data: str
    created: str


class OutputPage(BaseModel):
    items: list[OutputChunkOut]
    ended: bool
    next_cursor: int


def _chunk(row: dict[str, Any]) -> dict[str, Any]:
    data, encoding = output_text(bytes(row["data"]))
    return {
        "id": row["id"],
        "attempt": row["attempt"],
        "stream": row["stream"],
        "encoding": encoding,
        "data": data,
        "created": row["created"].isoformat(),
    }


async def _read(ctx: ApiContext, eid: int, after: int, limit: int) -> tuple[list[dict[str, Any]], bool]:
    async with ctx.pool.connection() as conn:
        params = {"id": eid, "after": after, "limit": limit}
        rows = await (await conn.execute(Q["execution_output"], params)).fetchall()
    if not rows:
        raise ExecutionNotFoundError(eid)
    return [_chunk(r) for r in rows if r["id"] is not None], bool(rows[0]["ended"])


@router.get("/{execution_id}/output", response_model=OutputPage, responses=ERRORS)
async def output(
    execution_id: int,
    ctx: Ctx,
    _: Viewer,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="only chunks after this id")] = 0,
    limit: Annotated[int, Query(ge=1, le=_PAGE)] = _PAGE,
) -> dict[str, Any]:
    """What the execution printed so far, in order, after the cursor ``after``; ``ended``:
    it has finished (and nothing more will come once this page is the last);
    ``next_cursor``: the ``after`` of the next page."""
    items, ended = await _read(ctx, valid_id(execution_id), after, limit)
    return {"items": items, "ended": ended, "next_cursor": items[-1]["id"] if items else after}


@router.get("/{execution_id}/output/stream", responses=ERRORS, response_class=StreamingResponse)
async def output_stream(
    execution_id: int,
    request: Request,
    ctx: Ctx,
    _: Viewer,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="only chunks after this id")] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Server-sent events: an ``output`` event per chunk (its id is the chunk's, so a client
    that reconnects with ``Last-Event-ID`` resumes after it), then, once the execution has
    ended and all of it was sent, one ``end`` event and the stream closes. A comment line
    every 15 s keeps proxies from closing a quiet stream."""
    eid = valid_id(execution_id)
    if last_event_id is not None and last_event_id.strip().isdigit():
        after = max(after, min(int(last_event_id.strip()), MAX_ID))
    await _read(ctx, eid, after, 1)  # 404 now, not inside an open stream
    return StreamingResponse(
        _events(request, ctx, eid, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(request: Request, ctx: ApiContext, eid: int, after: int) -> AsyncIterator[str]:
    tick = min(_TICK, ctx.settings.api.stream_interval)
    quiet = 0.0
    failing = False
    yield f": output of execution {eid}\n\n"
    while not await request.is_disconnected():
        try:
            items, ended = await _read(ctx, eid, after, _PAGE)
            failing = False
        except ExecutionNotFoundError:  # purged while followed
            yield 'event: end\ndata: {"purged":true}\n\n'
            return
        except psycopg.OperationalError as exc:  # the database is away: keep the stream, read again
            if not failing:
                log_operational(log, "output stream read", exc)
            failing, items, ended = True, [], False
        for item in items:
            after = item["id"]
            yield f"id: {after}\nevent: output\ndata: {json.dumps(item, separators=(',', ':'))}\n\n"
        if len(items) >= _PAGE:
            continue
        if ended and not failing:
            yield "event: end\ndata: {}\n\n"
            return
        quiet = 0.0 if items else quiet + tick
        if quiet >= _KEEPALIVE:
            quiet = 0.0
            yield ": keepalive\n\n"
        await asyncio.sleep(tick)
