"""``/api/v1/rules``: register (a JSON or YAML body), list, get with recent enforcements,
delete, enable, disable. Validation is the SDK's and CLI's (conveyor.rules.parse: every
problem with its path, 422); each change is one SQL function of migration 0016."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status
from starlette.concurrency import run_in_threadpool

from conveyor.api.auth import Operator, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.rule_schemas import RuleEnabledOut, RuleOut, RuleRegistered, RuleSummaryOut
from conveyor.api.workflow_schemas import InvalidWorkflowOut
from conveyor.rules import parse
from conveyor.store.queries import Q
from conveyor.verbs import rules as rule_verbs
from conveyor.verbs.drive import run_async

router = APIRouter(prefix="/rules", tags=["rules"])
Ctx = Annotated[ApiContext, Depends(context)]
RULE_BODY = {
    "requestBody": {
        "required": True,
        # YAML text (application/yaml) is accepted too -- the body is read as YAML, which
        # JSON is -- but only JSON is declared: a YAML string schema would let generated
        # clients send any text, which is no rule either way.
        "description": "one rule, as JSON (or YAML text: StackStorm's rule files load unchanged)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
REGISTER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    422: {"model": InvalidWorkflowOut, "description": "the rule is invalid: every problem with its path"},
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RuleRegistered,
    responses=REGISTER_RESPONSES,
    openapi_extra=RULE_BODY,
)
async def register(request: Request, ctx: Ctx, _: Operator) -> dict[str, Any]:
    """Register (create or update) a rule; nothing is stored unless it is valid."""
    body = await request.body()
    # YAML and templates are CPU work: off the event loop.
    spec = await run_in_threadpool(parse.load, body, "", ctx.settings.documents.limits())
    async with ctx.pool.connection() as conn:
        (registered,) = await run_async(conn, rule_verbs.register([spec]))
    return registered


@router.get("", response_model=list[RuleSummaryOut], responses=ERRORS)
async def list_rules(
    ctx: Ctx, _: Viewer, trigger: str | None = None, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000
) -> list[dict[str, Any]]:
    """Rules by ref (``trigger``: only those on it), each with its count of enforcements."""
    async with ctx.pool.connection() as conn:
        return list(await (await conn.execute(Q["list_rules"], {"trigger": trigger, "limit": limit})).fetchall())


@router.get("/{ref}", response_model=RuleOut, responses=ERRORS)
async def get_rule(
    ref: str, ctx: Ctx, _: Viewer, enforcements: Annotated[int, Query(ge=0, le=1000)] = 20
) -> dict[str, Any]:
    """A rule, its definition, and its most recent enforcements."""
    async with ctx.pool.connection() as conn:
        out = rule_verbs.found(ref, await (await conn.execute(Q["get_rule"], {"ref": ref})).fetchone())
        out["recent"] = await (
            await conn.execute(Q["rule_enforcements"], {"ref": ref, "limit": enforcements})
        ).fetchall()
    return out


@router.delete("/{ref}", status_code=status.HTTP_204_NO_CONTENT, responses=ERRORS)
async def delete_rule(ref: str, ctx: Ctx, _: Operator) -> None:
    """Delete a rule; its enforcements stay, naming it (rule_ref)."""
    async with ctx.pool.connection() as conn:
        await run_async(conn, rule_verbs.delete(ref))


async def _set(ctx: ApiContext, ref: str, enabled: bool) -> dict[str, Any]:
    async with ctx.pool.connection() as conn:
        was = await run_async(conn, rule_verbs.set_enabled(ref, enabled))
    return {"ref": ref, "enabled": enabled, "was": was}


@router.post("/{ref}/enable", response_model=RuleEnabledOut, responses=ERRORS)
async def enable(ref: str, ctx: Ctx, _: Operator) -> dict[str, Any]:
    return await _set(ctx, ref, True)


@router.post("/{ref}/disable", response_model=RuleEnabledOut, responses=ERRORS)
async def disable(ref: str, ctx: Ctx, _: Operator) -> dict[str, Any]:
    """Disable: matching events are then recorded as 'rule_disabled', nothing requested."""
    return await _set(ctx, ref, False)
