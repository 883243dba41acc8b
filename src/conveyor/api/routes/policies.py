"""``/api/v1/policies``: admission policies (the CLI's ``conveyor policies``). Viewers
read; admins set and delete, since a limit affects every user of an action."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException

from conveyor.api.auth import Admin, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.schemas import ErrorOut, PolicyDeleted, PolicyIn, PolicyOut
from conveyor.domain.errors import InvalidPolicyError
from conveyor.store.queries import Q
from conveyor.verbs import policies
from conveyor.verbs.drive import run_async

router = APIRouter(prefix="/policies", tags=["policies"])
Ctx = Annotated[ApiContext, Depends(context)]
WITH_CONFLICT: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    409: {"model": ErrorOut, "description": "the policy comes from the action's definition"},
}


@router.get("", response_model=list[PolicyOut], responses=ERRORS)
async def list_policies(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    """Every policy, most specific scope first, with the slots held and executions waiting now."""
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_policies"])).fetchall())


@router.get("/{target}", response_model=PolicyOut, responses=ERRORS)
async def get_policy(target: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:  # an impossible target names nothing: 404, like an unknown one
        return await run_async(conn, policies.get(target))


@router.put("/{target}", response_model=PolicyOut, responses=WITH_BODY)
async def set_policy(target: str, body: PolicyIn, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Create or replace the operator policy for ``target``: an action ref (``pack.name``), a
    pack or ``*``. It wins over the action's own ``policy=`` and over less specific targets
    (action > pack > global). Waiters a higher limit allows are admitted at once."""
    verb = policies.set_policy(target, body.concurrency, body.parameters, body.method)
    try:
        async with ctx.pool.connection() as conn:
            return await run_async(conn, verb)
    except InvalidPolicyError as exc:
        raise HTTPException(422, str(exc)) from None  # as a body that fails validation


@router.delete("/{target}", response_model=PolicyDeleted, responses=WITH_CONFLICT)
async def delete_policy(target: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Delete it; whoever it kept waiting may be scheduled. Deleting an override of an
    action's own policy puts that one back (``restored``); deleting the policy an action's
    definition declares is refused (409): override it instead."""
    async with ctx.pool.connection() as conn:
        return await run_async(conn, policies.delete_policy(target))
