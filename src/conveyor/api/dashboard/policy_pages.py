"""``/policies`` (issue #15): every admission policy -- target, scope, limit, grouping,
method, source -- with the executions holding its slots now and its queue (the first
``catalog.QUEUE_SHOWN`` waiting per group, with their position, and how many more).
Admins, the role ``PUT``/``DELETE /api/v1/policies/{target}`` require, get a form to set
one and a button to delete one; the page's script (static/policies.js) calls those
endpoints, so the API checks and refuses as it does for the CLI."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from conveyor.api.dashboard import catalog
from conveyor.api.dashboard.pages import _view

router = APIRouter()


@router.get("/policies")
async def policies(request: Request) -> Response:
    return await _view(request, "policies.html", catalog.policies)


@router.get("/_live/policies")
async def policies_live(request: Request) -> Response:
    return await _view(request, "policies.html", catalog.policies, live=True)
