"""``/api/v1/dead-letters``: list, get, replay, purge (the CLI's operations)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from conveyor.api.auth import Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS
from conveyor.api.schemas import DeadLetterOut, PurgeOut, ReplayOut
from conveyor.domain.dead_letters import REASONS, RESOLUTIONS
from conveyor.domain.errors import ConflictError, ConveyorError, NotFoundError
from conveyor.domain.ids import MAX_ID, is_id
from conveyor.store.queries import Q
from conveyor.verbs import dead_letters
from conveyor.verbs.drive import run_async

router = APIRouter(prefix="/dead-letters", tags=["dead letters"])
Ctx = Annotated[ApiContext, Depends(context)]
Reason = Annotated[str | None, Query(pattern="^(" + "|".join(REASONS) + ")$")]
Resolution = Annotated[str | None, Query(pattern="^(" + "|".join(RESOLUTIONS) + ")$")]
Id = Annotated[int | None, Query(ge=1, le=MAX_ID)]


@router.get("", response_model=list[DeadLetterOut], responses=ERRORS)
async def list_dead_letters(
    ctx: Ctx,
    _: Viewer,
    reason: Reason = None,
    resolution: Resolution = None,
    execution: Id = None,
    queue: str | None = None,
    since: Annotated[float | None, Query(ge=0, le=10**9, description="seconds back")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    params = {
        "reason": reason,
        "resolution": resolution,
        "execution": execution,
        "queue": queue,
        "since": since,
        "limit": limit,
    }
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_dead_letters"], params)).fetchall())


def _id(dead_letter_id: int) -> int:
    if not is_id(dead_letter_id):
        raise NotFoundError(f"no dead letter with id {dead_letter_id}")
    return dead_letter_id


@router.get("/{dead_letter_id}", response_model=DeadLetterOut, responses=ERRORS)
async def get_dead_letter(dead_letter_id: int, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        row = await (await conn.execute(Q["get_dead_letter"], {"id": _id(dead_letter_id)})).fetchone()
    if row is None:
        raise NotFoundError(f"no dead letter with id {dead_letter_id}")
    return dict(row)


@router.post(
    "/{dead_letter_id}/replay", response_model=ReplayOut, responses={**ERRORS, 409: {"model": ERRORS[422]["model"]}}
)
async def replay(dead_letter_id: int, ctx: Ctx, principal: Operator) -> dict[str, Any]:
    """Publish it again to where it was going (the handlers are guarded: a stale one changes nothing)."""
    verb = dead_letters.replay(_id(dead_letter_id), by=f"api:{principal.name}", skip_replayed=False)
    async with ctx.pool.connection() as conn:
        outcome = await run_async(conn, verb)
    if outcome.error is not None:
        if outcome.error.startswith("no dead letter"):
            raise NotFoundError(outcome.error)
        raise ConflictError(outcome.error)
    return {"id": dead_letter_id, "resolution": "replayed"}


@router.delete("", response_model=PurgeOut, responses=ERRORS)
async def purge(
    ctx: Ctx,
    _: Operator,
    reason: Reason = None,
    resolution: Resolution = None,
    execution: Id = None,
    queue: str | None = None,
    older_than: Annotated[float | None, Query(ge=0, le=10**9, description="seconds")] = None,
    include_pending: bool = False,
    all_: Annotated[bool, Query(alias="all", description="purge without any filter")] = False,
) -> dict[str, int]:
    """Delete records matching the filters: resolved ones only unless ``include_pending``."""
    filters = dead_letters.PurgeFilters(reason, resolution, execution, queue, older_than, include_pending)
    if not all_ and not filters.given:
        raise ConveyorError("purge needs a filter (reason, resolution, execution, queue, older_than) or all=true")
    async with ctx.pool.connection() as conn:
        return {"deleted": await run_async(conn, dead_letters.purge(filters))}
