"""API token verbs (an admin's): create and revoke, each one SQL function
(``create_api_token``, ``revoke_api_token``, migration 0035), run by ``drive.run`` (SDK,
CLI) and ``drive.run_async`` (API, ``conveyor up``'s first admin token). The secret is
made here and never stored: the database keeps its hash and first characters."""

from __future__ import annotations

from typing import Any

from conveyor.domain.errors import NotFoundError
from conveyor.domain.ids import is_id
from conveyor.domain.tokens import Role, token_row
from conveyor.verbs.drive import Verb, sql


def create(name: str, role: Role) -> Verb[tuple[str, dict[str, Any]]]:
    """A new token for ``name`` with ``role``: (the token, shown once; its stored row:
    id, name, role, prefix, created)."""
    token, params = token_row(name, role)
    row = yield sql("create_token", params)
    assert row is not None  # the function inserts and returns its row
    return token, dict(row)


def revoke(token_id: int) -> Verb[int]:
    """Revoke a live token (the API refuses it within seconds: its cache); answers its
    id. NotFoundError: no live token of that id (never one, or revoked already)."""
    # revoke_api_token takes a bigint: a number outside it names no token.
    row = (yield sql("revoke_token", {"id": token_id})) if is_id(token_id) else None
    if row is None:
        raise NotFoundError(f"no live token with id {token_id}")
    return int(row["id"])
