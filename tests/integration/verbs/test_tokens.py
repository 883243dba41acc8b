"""The token verbs (create, revoke) through both drivers: the same answers, the same
refusal; the secret is never stored, only its hash."""

from __future__ import annotations

from conveyor.domain.errors import NotFoundError
from conveyor.domain.tokens import PREFIX, Role, token_hash
from conveyor.store.db import Conn, Pool
from conveyor.verbs import tokens
from conveyor.verbs.drive import run
from integration.verbs.both_drivers import both, both_refuse


async def test_create_then_revoke(conn: Conn, pool: Pool) -> None:
    (first, made), (second, other) = await both(conn, pool, lambda: tokens.create("deploy bot", Role.operator))
    assert first != second
    for token, row in ((first, made), (second, other)):
        assert token.startswith(PREFIX)
        assert (row["name"], row["role"], row["prefix"]) == ("deploy bot", "operator", token[: len(PREFIX) + 6])
        stored = conn.execute("SELECT token_hash, revoked FROM api_token WHERE id = %s", (row["id"],)).fetchone()
        assert stored == {"token_hash": token_hash(token), "revoked": None}
    ids = iter((made["id"], other["id"]))
    assert await both(conn, pool, lambda: tokens.revoke(next(ids))) == (made["id"], other["id"])
    revoked = conn.execute("SELECT count(*)::int AS n FROM api_token WHERE revoked IS NOT NULL").fetchone()
    assert revoked == {"n": 2}


async def test_no_live_token(conn: Conn, pool: Pool) -> None:
    _, row = run(conn, tokens.create("once", Role.viewer))
    run(conn, tokens.revoke(row["id"]))
    for missing in (row["id"], row["id"] + 1000, 0, 10**30):  # revoked once; never made; no bigint
        message = await both_refuse(conn, pool, lambda m=missing: tokens.revoke(m), NotFoundError)
        assert message == f"no live token with id {missing}"
