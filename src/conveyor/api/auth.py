"""Bearer-token authentication for the API and the dashboard (which sends the same
token in a cookie). Roles and token format: ``conveyor.domain.tokens``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status

from conveyor.api.context import ApiPool
from conveyor.domain.tokens import Role, token_hash
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q
from conveyor.verbs import tokens
from conveyor.verbs.drive import run_async

__all__ = ["Admin", "Operator", "Principal", "Role", "Viewer", "authenticate", "create_token"]

COOKIE = "conveyor_token"
CSRF_HEADER = "X-Conveyor-Dashboard"
_CACHE_SECONDS = 5.0  # a revoked token stops working within this


@dataclass(frozen=True, slots=True)
class Principal:
    token_id: int
    name: str
    role: Role


async def create_token(conn: AsyncConn, name: str, role: Role) -> tuple[str, dict[str, Any]]:
    """A new token (shown only now) and its row: ``conveyor.verbs.tokens.create``."""
    return await run_async(conn, tokens.create(name, role))


class TokenCache:
    """Token hash -> principal for a few seconds: one lookup per token, not per request."""

    def __init__(self, pool: ApiPool) -> None:
        self._pool = pool
        self._entries: dict[bytes, tuple[float, Principal | None]] = {}

    async def lookup(self, token: str) -> Principal | None:
        digest = token_hash(token)
        now = time.monotonic()
        cached = self._entries.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        async with self._pool.connection() as conn:
            row = await (await conn.execute(Q["token_by_hash"], {"hash": digest})).fetchone()
        principal = Principal(row["id"], row["name"], Role[row["role"]]) if row else None
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = (now + _CACHE_SECONDS, principal)
        return principal


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _token_from(request: Request) -> str | None:
    return _bearer(request) or request.cookies.get(COOKIE)


async def authenticate(request: Request) -> Principal:
    token = _token_from(request)
    # CSRF guard for the dashboard's cookie: a state-changing request authenticated by the
    # cookie alone must carry the dashboard's custom header (which a cross-site form cannot
    # send, nor a cross-site fetch without a CORS preflight we never grant). Bearer clients
    # are unaffected.
    if (
        token
        and _bearer(request) is None
        and request.method not in ("GET", "HEAD", "OPTIONS")
        and request.headers.get(CSRF_HEADER) != "1"
    ):
        message = f"a state-changing request authenticated by the dashboard cookie needs the {CSRF_HEADER}: 1 header"
        raise HTTPException(status.HTTP_403_FORBIDDEN, message)
    if not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing token: send `Authorization: Bearer <token>` (create one with `conveyor tokens create`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal: Principal | None = await request.app.state.tokens.lookup(token)
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"}
        )
    return principal


def _require(role: Role) -> Any:
    """A dependency: the caller's principal, with at least ``role``."""

    async def dependency(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if principal.role < role:
            message = f"this needs the {role.name} role; token {principal.name!r} is {principal.role.name}"
            raise HTTPException(status.HTTP_403_FORBIDDEN, message)
        return principal

    return dependency


Viewer = Annotated[Principal, Depends(_require(Role.viewer))]
Operator = Annotated[Principal, Depends(_require(Role.operator))]
Admin = Annotated[Principal, Depends(_require(Role.admin))]
