"""``/api/v1/actions``, ``/api/v1/workers`` (list; cordon, uncordon, drain),
``/api/v1/tokens`` (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, status

from conveyor.api.auth import Admin, Role, Viewer, create_token
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.schemas import ActionOut, TokenCreate, TokenCreated, TokenOut, WorkerChange, WorkerOut
from conveyor.domain.errors import NotFoundError
from conveyor.store.queries import Q
from conveyor.verbs import tokens, workers
from conveyor.verbs.drive import run_async

router = APIRouter()
Ctx = Annotated[ApiContext, Depends(context)]


@router.get("/actions", response_model=list[ActionOut], responses=ERRORS, tags=["actions"])
async def list_actions(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_actions"])).fetchall())


@router.get("/actions/{ref}", response_model=ActionOut, responses=ERRORS, tags=["actions"])
async def get_action(ref: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        row = await (await conn.execute(Q["get_action"], {"ref": ref})).fetchone()
    if row is None:
        raise NotFoundError(f"no action {ref!r}")
    return dict(row)


@router.get("/workers", response_model=list[WorkerOut], responses=ERRORS, tags=["workers"])
async def list_workers(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_workers"])).fetchall())


async def _cordon(ctx: ApiContext, name: str, cordoned: bool) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        return await run_async(conn, workers.cordon(name, cordoned))


@router.post("/workers/{name}/cordon", response_model=WorkerChange, responses=ERRORS, tags=["workers"])
async def cordon(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Give it nothing new; what it runs finishes there."""
    return await _cordon(ctx, name, True)


@router.post("/workers/{name}/uncordon", response_model=WorkerChange, responses=ERRORS, tags=["workers"])
async def uncordon(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    return await _cordon(ctx, name, False)


@router.post("/workers/{name}/drain", response_model=WorkerChange, responses=ERRORS, tags=["workers"])
async def drain(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Cordon it and hand its not-yet-started work to other workers."""
    async with ctx.pool.connection() as conn:
        return await run_async(conn, workers.drain(name))


@router.get("/tokens", response_model=list[TokenOut], responses=ERRORS, tags=["tokens"])
async def list_tokens(ctx: Ctx, _: Admin) -> list[dict[str, Any]]:
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_tokens"])).fetchall())


@router.post(
    "/tokens", status_code=status.HTTP_201_CREATED, response_model=TokenCreated, responses=WITH_BODY, tags=["tokens"]
)
async def new_token(body: TokenCreate, ctx: Ctx, _: Admin) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        token, row = await create_token(conn, body.name, Role[body.role])
    return {**row, "token": token}


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=ERRORS, tags=["tokens"])
async def revoke_token(token_id: int, ctx: Ctx, _: Admin) -> None:
    async with ctx.pool.connection() as conn:
        await run_async(conn, tokens.revoke(token_id))
