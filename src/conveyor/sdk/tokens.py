"""The SDK's API token methods (part of :class:`conveyor.sdk.Client`): the tokens the API
and the dashboard take, stored hashed and shown once. Creating and revoking are the verbs
of ``conveyor.verbs.tokens``, as the API runs them.

    with Client(url) as client:
        token, row = client.create_token("operator", "deploy bot")
        client.revoke_token(row["id"])
"""

from __future__ import annotations

from typing import Any

from conveyor.domain.errors import ConveyorError, NotFoundError
from conveyor.domain.tokens import Role
from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import tokens
from conveyor.verbs.drive import run


class TokenMethods:
    conn: Conn

    def tokens(self) -> list[dict[str, Any]]:
        """Every token, oldest first: id, name, role, prefix (its first characters; never
        the token itself), created, last_used, revoked."""
        return list(self.conn.execute(Q["list_tokens"]).fetchall())

    def token(self, token_id: int) -> dict[str, Any]:
        """One token as :meth:`tokens` lists it."""
        row = next((r for r in self.tokens() if r["id"] == token_id), None)
        if row is None:  # tokens are revoked, never deleted
            raise NotFoundError(f"no token with id {token_id}")
        return row

    def create_token(self, role: Role | str, name: str) -> tuple[str, dict[str, Any]]:
        """A new token with ``role`` (viewer, operator or admin) for ``name`` (what it is
        for): (the token, shown only now; its row: id, name, role, prefix, created)."""
        if not isinstance(role, Role):
            if role not in Role.__members__:
                raise ConveyorError(f"unknown role {role!r}: give viewer, operator or admin")
            role = Role[role]
        return run(self.conn, tokens.create(name, role))

    def revoke_token(self, token_id: int) -> int:
        """Revoke a live token (the API refuses it within seconds); returns its id.
        NotFoundError: no live token of that id."""
        return run(self.conn, tokens.revoke(token_id))
