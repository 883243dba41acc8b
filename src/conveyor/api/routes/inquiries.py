"""``/api/v1/inquiries``: list, get, respond. The responder is the bearer token's name,
with its role; the answer is checked against the inquiry's schema (422 naming every
problem's path), then ``respond_inquiry`` decides: 403 not an assignee or the forbidden
requester, 404 no such inquiry, 409 no longer pending or already answered by this
token."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from conveyor.api.auth import Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.schemas import ErrorOut, InquiryOut, InquiryPage, RespondIn, RespondOut
from conveyor.domain.ids import MAX_ID, is_id
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q
from conveyor.verbs import inquiries
from conveyor.verbs.drive import run_async

router = APIRouter(prefix="/inquiries", tags=["inquiries"])
Ctx = Annotated[ApiContext, Depends(context)]
Status = Annotated[str | None, Query(pattern="^(pending|responded|timeout|cancelled)$")]
RESPOND_ERRORS: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    403: {"model": ErrorOut, "description": "not an assignee, or the requester of an inquiry that forbids it"},
    409: {"model": ErrorOut, "description": "no longer pending, or this token answered already"},
    422: {"model": ErrorOut, "description": "the answer does not satisfy the schema (problems: each path)"},
}


def _valid_id(inquiry_id: int) -> int:
    if not is_id(inquiry_id):
        raise inquiries.not_found(inquiry_id)
    return inquiry_id


async def get_inquiry(conn: AsyncConn, inquiry_id: int) -> dict[str, Any]:
    row = await (await conn.execute(Q["get_inquiry"], {"id": inquiry_id})).fetchone()
    if row is None:
        raise inquiries.not_found(inquiry_id)
    responses = await (await conn.execute(Q["inquiry_responses"], {"id": inquiry_id})).fetchall()
    return {**row, "responses": responses}


@router.get("", response_model=InquiryPage, responses=ERRORS, response_model_by_alias=True)
async def list_inquiries(
    ctx: Ctx,
    _: Viewer,
    status: Status = None,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="cursor: ids below this")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """Newest first; ``?status=pending`` for the ones waiting for an answer."""
    async with ctx.pool.connection() as conn:
        rows = await (
            await conn.execute(Q["list_inquiries"], {"status": status, "before": before, "limit": limit})
        ).fetchall()
    return {"items": rows, "next_cursor": rows[-1]["id"] if len(rows) == limit else None}


@router.get("/{inquiry_id}", response_model=InquiryOut, responses=ERRORS, response_model_by_alias=True)
async def get(inquiry_id: int, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """One inquiry with every answer it was given (who, with which role, when, what)."""
    async with ctx.pool.connection() as conn:
        return await get_inquiry(conn, _valid_id(inquiry_id))


@router.post("/{inquiry_id}/respond", response_model=RespondOut, responses=RESPOND_ERRORS)
async def respond(inquiry_id: int, body: RespondIn, ctx: Ctx, principal: Viewer) -> dict[str, Any]:
    """Answer as this token (its name and role). ``answered`` when the quorum is reached (the
    asking execution completes with the answer); ``recorded`` while more distinct
    responders are needed."""
    verb = inquiries.respond(_valid_id(inquiry_id), body.data, responder=principal.name, role=principal.role.name)
    async with ctx.pool.connection() as conn:
        return await run_async(conn, verb)
