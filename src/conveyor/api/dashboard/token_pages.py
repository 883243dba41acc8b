"""``/tokens`` (issue #15): the API tokens, for admins (the API's own role for them):
name, role, prefix, created, last used, revoked -- never a secret, which the database
does not hold (only its hash). Creating and revoking go through ``/api/v1/tokens`` from
the page's script; the new token is shown once, by the script, from the API's answer."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from conveyor.api.auth import Role
from conveyor.api.dashboard.pages import _view
from conveyor.api.dashboard.web import HEADERS, principal_of, render
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

router = APIRouter()
_NEEDS = "managing tokens needs the admin role"


async def _tokens(conn: AsyncConn) -> dict[str, Any]:
    return {"tokens": list(await (await conn.execute(Q["list_tokens"])).fetchall())}


@router.get("/tokens")
async def tokens(request: Request) -> Response:
    principal = await principal_of(request)
    if principal is not None and principal.role < Role.admin:  # as GET /api/v1/tokens would answer
        return render(
            request, "error.html", principal, status_code=403, message=f"{_NEEDS}; this token is {principal.role.name}"
        )
    return await _view(request, "tokens.html", _tokens)


@router.get("/_live/tokens")
async def tokens_live(request: Request) -> Response:
    principal = await principal_of(request)
    if principal is not None and principal.role < Role.admin:
        return Response(_NEEDS, status_code=403, headers=HEADERS)
    return await _view(request, "tokens.html", _tokens, live=True)
