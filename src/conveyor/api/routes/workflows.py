"""``/api/v1/workflows`` (register, list, get with versions and graph, delete) and a
workflow execution's ``/tree``, ``/children``, ``/pause`` and ``/resume`` under
``/api/v1/executions/{id}``. The checks are those of the SDK and CLI
(workflows/registration.py, verbs.py); each change is one SQL function."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, status

from conveyor.api.auth import Admin, Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, WITH_BODY, valid_id
from conveyor.api.schemas import ErrorOut, ExecutionSummaryOut
from conveyor.api.workflow_schemas import (
    InvalidWorkflowOut,
    StatusOut,
    TreeOut,
    WorkflowDeleted,
    WorkflowIn,
    WorkflowOut,
    WorkflowSummaryOut,
)
from conveyor.domain.errors import ExecutionNotFoundError, NotFoundError
from conveyor.domain.ids import MAX_ID
from conveyor.domain.models import summary_fields
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q
from conveyor.verbs import common as verbs
from conveyor.verbs import executions as execution_verbs
from conveyor.verbs import workflows as definitions
from conveyor.verbs.drive import run_async
from conveyor.workflows.registration import Definition

router = APIRouter(prefix="/workflows", tags=["workflows"])
executions = APIRouter(prefix="/executions", tags=["executions"])
Ctx = Annotated[ApiContext, Depends(context)]
REGISTER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    409: {"model": ErrorOut, "description": "the ref is an action of another runner type"},
    422: {"model": InvalidWorkflowOut, "description": "the definition is invalid: every problem with its path"},
}
CHANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    409: {"model": ErrorOut, "description": "not a workflow execution in a status that allows it"},
}


async def _workflow(conn: AsyncConn, ref: str, version: int | None = None) -> dict[str, Any]:
    row = await (await conn.execute(Q["get_workflow"], {"ref": ref, "version": version})).fetchone()
    versions = await (await conn.execute(Q["workflow_versions"], {"ref": ref})).fetchall()
    return definitions.found(ref, version, row, versions)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WorkflowOut, responses=REGISTER_RESPONSES)
async def register(body: WorkflowIn, ctx: Ctx, _: Operator) -> dict[str, Any]:
    """Register a definition (a new version when its ref exists): checked first, every
    problem answered at once (422 with their paths); nothing is stored unless it is valid."""
    definition = Definition(text=body.source, data=body.definition, ref=body.ref)
    # The version registered is answered as stored, read in the same transaction.
    async with ctx.pool.connection() as conn, conn.transaction():
        (registered,) = await run_async(conn, definitions.register([definition], ctx.settings.documents.limits()))
        return await _workflow(conn, registered["ref"], registered["version"])


@router.get("", response_model=list[WorkflowSummaryOut], responses=ERRORS)
async def list_workflows(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    """Every workflow not deleted, with its latest version."""
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_workflows"])).fetchall())


@router.get("/{ref}", response_model=WorkflowOut, responses=ERRORS)
async def get_workflow(
    ref: str, ctx: Ctx, _: Viewer, version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None
) -> dict[str, Any]:
    """A definition (the latest version, or ``version``) with its versions and its graph:
    nodes (tasks) and edges (transitions between them)."""
    async with ctx.pool.connection() as conn:
        return await _workflow(conn, ref, version)


@router.delete("/{ref}", response_model=WorkflowDeleted, responses=ERRORS)
async def delete_workflow(ref: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Delete every version: it can no longer be requested; running executions finish."""
    async with ctx.pool.connection() as conn:
        return {"ref": ref, "versions": await run_async(conn, definitions.delete(ref))}


# -- a workflow execution -------------------------------------------------------------------


@executions.get("/{execution_id}/tree", response_model=TreeOut, responses=ERRORS)
async def tree(
    execution_id: int, ctx: Ctx, _: Viewer, items: Annotated[int, Query(ge=0, le=10_000)] = 100
) -> dict[str, Any]:
    """The workflow's state and its task instances (oldest first), each with its first
    ``items`` child chains (item index, retries, child execution, status, attempt, a
    summary of the result) and counts over all of them. 404 for an execution that is not
    a started workflow."""
    eid = valid_id(execution_id)
    async with ctx.pool.connection() as conn:
        workflow = await (await conn.execute(Q["workflow_of_execution"], {"id": eid})).fetchone()
        if workflow is None:
            if await (await conn.execute(Q["get_execution"], {"id": eid})).fetchone() is None:
                raise ExecutionNotFoundError(eid)
            raise NotFoundError(f"execution {eid} is not a workflow execution (or has not started)")
        tasks = await (await conn.execute(Q["workflow_tree"], {"id": eid, "items": items})).fetchall()
    return verbs.workflow_tree(workflow, tasks)


@executions.get("/{execution_id}/children", response_model=list[ExecutionSummaryOut], responses=ERRORS)
async def children(
    execution_id: int,
    ctx: Ctx,
    _: Viewer,
    after: Annotated[int | None, Query(ge=1, le=MAX_ID, description="cursor: ids above this")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """The executions it requested (its tasks' children, retries included), oldest first,
    as summaries."""
    eid = valid_id(execution_id)
    async with ctx.pool.connection() as conn:
        if await (await conn.execute(Q["get_execution"], {"id": eid})).fetchone() is None:
            raise ExecutionNotFoundError(eid)
        rows = await (
            await conn.execute(Q["execution_children"], {"id": eid, "after": after, "limit": limit})
        ).fetchall()
    return [summary_fields(r) for r in rows]


@executions.post("/{execution_id}/pause", response_model=StatusOut, responses=CHANGE_RESPONSES)
async def pause(execution_id: int, ctx: Ctx, principal: Operator) -> dict[str, Any]:
    """Pause a running workflow: no new task starts; children in flight finish."""
    eid = valid_id(execution_id)
    verb = lambda: execution_verbs.pause(eid, principal.name)  # noqa: E731 (run again after a deadlock)
    async with ctx.pool.connection() as conn:
        now = await run_async(conn, verb, retries=ctx.settings.database.verb_retries)
    return {"id": eid, "status": now}


@executions.post("/{execution_id}/resume", response_model=StatusOut, responses=CHANGE_RESPONSES)
async def resume(execution_id: int, ctx: Ctx, principal: Operator) -> dict[str, Any]:
    """Resume a paused workflow."""
    eid = valid_id(execution_id)
    verb = lambda: execution_verbs.resume(eid, principal.name)  # noqa: E731 (run again after a deadlock)
    async with ctx.pool.connection() as conn:
        now = await run_async(conn, verb, retries=ctx.settings.database.verb_retries)
    return {"id": eid, "status": now}
