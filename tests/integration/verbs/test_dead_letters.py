"""The dead-letter verbs (replay, purge) through both drivers: the same outcomes. A letter
that cannot be replayed (not a Conveyor message, none such) is an outcome, not an error:
replaying many goes on past it."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from conveyor.store.db import Conn, Pool
from conveyor.verbs import dead_letters
from conveyor.verbs.dead_letters import Outcome, PurgeFilters
from integration.verbs.both_drivers import both

MESSAGE = {
    "message_id": "m",
    "message_type": "execution.requested",
    "created": "2026-01-01T00:00:00+00:00",
    "payload": {"execution_ids": []},
}


def letter(conn: Conn, payload: dict[str, Any] = MESSAGE, resolution: str | None = None) -> int:
    row = conn.execute(
        "INSERT INTO dead_letter (dedupe_key, message_id, transport, queue, routing_key, reason, message_type,"
        " payload, resolution, resolved) VALUES (gen_random_uuid()::text, 'm', 'postgres',"
        " 'conveyor.executor.requests', 'execution.requested', 'rejected', 'execution.requested', %s, %s,"
        " CASE WHEN %s::text IS NULL THEN NULL ELSE now() END) RETURNING id",
        (Jsonb(payload), resolution, resolution),
    ).fetchone()
    assert row is not None
    return int(row["id"])


def resolution(conn: Conn, dead_letter_id: int) -> dict[str, Any]:
    row = conn.execute("SELECT resolution, resolved_by FROM dead_letter WHERE id = %s", (dead_letter_id,)).fetchone()
    assert row is not None
    return dict(row)


async def test_replay(conn: Conn, pool: Pool) -> None:
    ids = iter((letter(conn), letter(conn)))
    first, second = await both(conn, pool, lambda: dead_letters.replay(next(ids), by="test", skip_replayed=True))
    assert first == Outcome(first.id, routing_key="execution.requested")
    assert second == Outcome(second.id, routing_key="execution.requested")
    for replayed in (first.id, second.id):
        assert resolution(conn, replayed) == {"resolution": "replayed", "resolved_by": "test"}
    skipped = Outcome(first.id, skipped="replayed meanwhile by someone else")
    again = await both(conn, pool, lambda: dead_letters.replay(first.id, by="other", skip_replayed=True))
    assert again == (skipped, skipped)
    assert resolution(conn, first.id)["resolved_by"] == "test"


async def test_what_cannot_be_replayed_is_an_outcome(conn: Conn, pool: Pool) -> None:
    raw = letter(conn, {"raw": "not a message"})
    refused = await both(conn, pool, lambda: dead_letters.replay(raw, by="test", skip_replayed=False))
    error = f"dead letter {raw} cannot be replayed: its body is not a Conveyor message (resolution invalid); "
    assert refused == (Outcome(raw, error=error + "inspect it with `show`"),) * 2
    assert resolution(conn, raw) == {"resolution": None, "resolved_by": None}
    for missing in (raw + 1000, 0, 2**70):
        outcomes = await both(conn, pool, lambda m=missing: dead_letters.replay(m, by="test", skip_replayed=False))
        assert outcomes == (Outcome(missing, error=f"no dead letter with id {missing}"),) * 2


async def test_purge(conn: Conn, pool: Pool) -> None:
    pending = letter(conn)
    replayed = PurgeFilters(resolution="replayed")
    assert not PurgeFilters(include_pending=True).given
    assert replayed.given
    purged = await both(
        conn, pool, lambda: dead_letters.purge(replayed), before=lambda: letter(conn, resolution="replayed")
    )
    assert purged == (1, 1)
    assert await both(conn, pool, lambda: dead_letters.purge(PurgeFilters())) == (0, 0)  # resolved ones only
    assert await both(conn, pool, lambda: dead_letters.purge(PurgeFilters(include_pending=True))) == (1, 0)
    assert conn.execute("SELECT id FROM dead_letter WHERE id = %s", (pending,)).fetchone() is None
