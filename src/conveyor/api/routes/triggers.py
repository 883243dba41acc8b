"""``/api/v1/triggers``: list, get, register (create or update) a custom trigger with its
payload JSON Schema (422 when the schema is not a valid JSON Schema), delete (409 while
rules, webhooks, schedules or events use it). One SQL function each (migration 0016:
``register_trigger``, ``delete_trigger``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, status

from conveyor.api.auth import Admin, Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.event_schemas import TriggerCreate, TriggerIn, TriggerOut, TriggerRegistered
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.schemas import ErrorOut
from conveyor.domain import events as ev
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q
from conveyor.verbs import events as event_verbs
from conveyor.verbs.drive import run_async

router = APIRouter(prefix="/triggers", tags=["triggers"])
Ctx = Annotated[ApiContext, Depends(context)]
REGISTER_ERRORS: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    200: {"model": TriggerRegistered, "description": "an existing trigger was updated"},
    201: {"description": "the trigger was created"},
    409: {"model": ErrorOut, "description": "a trigger of another type (webhook, cron...) has this name"},
    422: {"model": ErrorOut, "description": "invalid name, or the payload schema is not a valid JSON Schema"},
}


async def _get(conn: AsyncConn, name: str) -> dict[str, Any]:
    if not ev.valid_trigger_name(name):
        raise ev.trigger_not_found(name)
    row = await (await conn.execute(Q["get_trigger"], {"name": name})).fetchone()
    if row is None:
        raise ev.trigger_not_found(name)
    return dict(row)


@router.get("", response_model=list[TriggerOut], responses=ERRORS)
async def list_triggers(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    """Every trigger by name, with how many rules use it and when its newest event came."""
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_triggers"])).fetchall())


@router.get("/{name}", response_model=TriggerOut, responses=ERRORS)
async def get(name: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        return await _get(conn, name)


async def _register(ctx: ApiContext, name: str, body: TriggerIn, response: Response) -> dict[str, Any]:
    verb = event_verbs.register_trigger(name, body.payload_schema, body.description)
    async with ctx.pool.connection() as conn:
        created = await run_async(conn, verb)
        row = await _get(conn, name)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return {**row, "created_now": created}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TriggerRegistered, responses=REGISTER_ERRORS)
async def create(body: TriggerCreate, ctx: Ctx, _: Operator, response: Response) -> dict[str, Any]:
    """Register a custom trigger (201), or update the one of that name (200): its payload
    schema and description. Events already received are not checked again."""
    return await _register(ctx, body.name, body, response)


@router.put("/{name}", status_code=status.HTTP_201_CREATED, response_model=TriggerRegistered, responses=REGISTER_ERRORS)
async def put(name: str, body: TriggerIn, ctx: Ctx, _: Operator, response: Response) -> dict[str, Any]:
    """As ``POST /api/v1/triggers`` with the name in the path."""
    return await _register(ctx, name, body, response)


@router.delete("/{name}", responses={**ERRORS, 409: {"model": ErrorOut, "description": "still in use"}})
async def delete(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Refused (409) while rules, webhooks or schedules use it, or events of it are kept."""
    async with ctx.pool.connection() as conn:
        await run_async(conn, event_verbs.delete_trigger(name))
    return {"deleted": name}
