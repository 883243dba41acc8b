"""``/actions`` and ``/actions/{ref}`` (issue #15): the registered actions -- runner,
description, parameters schema -- with the live workers the scheduler could give each one
to (``catalog.offering``) and its outcomes: counts by status over the last hour and, on an
action's page, its newest executions. Operators get a link to the executions page's
request form, the action chosen there (the API checks the request as always)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from conveyor.api.dashboard import catalog
from conveyor.api.dashboard.pages import Loader, _view
from conveyor.store.db import AsyncConn

router = APIRouter()


def _action_loader(ref: str) -> Loader:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await catalog.action(conn, ref)

    return load


@router.get("/actions")
async def actions(request: Request) -> Response:
    return await _view(request, "action_list.html", catalog.actions)


@router.get("/_live/actions")
async def actions_live(request: Request) -> Response:
    return await _view(request, "action_list.html", catalog.actions, live=True)


@router.get("/actions/{ref}")
async def action(request: Request, ref: str) -> Response:
    return await _view(request, "action.html", _action_loader(ref))


@router.get("/_live/actions/{ref}")
async def action_live(request: Request, ref: str) -> Response:
    return await _view(request, "action.html", _action_loader(ref), live=True)
