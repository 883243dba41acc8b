"""The dead-letter handler against the real database: a redelivered dead letter is
recorded once and resolved once, retention deletes old records, and numbers no column
can hold are recorded without being trusted."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.transport import messages as m
from conveyor.transport.postgres import PostgresTransport


def letter(body: bytes, key: str = "k1") -> m.DeadLetter:
    return m.DeadLetter(
        dedupe_key=key, message_id="m1", transport="rabbitmq", queue="conveyor.executor.requests",
        routing_key="execution.requested", reason="rejected", body=body,
    )  # fmt: skip


def handler(pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> DeadLetterHandler:
    return DeadLetterHandler(pool, transport, Settings(dead_letter={"ttl_ms": 3_600_000}), "test")


async def rows(pool: AsyncConnectionPool[Any]) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return [dict(r) for r in await (await conn.execute("SELECT * FROM dead_letter ORDER BY id")).fetchall()]


async def test_a_redelivered_dead_letter_is_recorded_and_resolved_once(
    pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    h = handler(pool, transport)
    body = m.encode("m1", m.REQUESTED, {"execution_ids": [7]}, m_now())
    assert await h.handle(letter(body)) == "stale"
    assert await h.handle(letter(body)) == "stale"
    (row,) = await rows(pool)
    assert row["deliveries"] == 2
    assert row["resolution"] == "stale"
    assert row["execution"] == 7
    assert row["message_type"] == m.REQUESTED


async def test_invalid_and_out_of_range_letters_are_recorded_as_invalid(
    pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    h = handler(pool, transport)
    huge = {"execution_id": 2**70, "attempt": 2**40, "worker_id": 1, "scheduled": "2026-01-01T00:00:00+00:00"}
    assert await h.handle(letter(m.encode("m2", m.SCHEDULED, huge, m_now()), "k2")) == "invalid"
    assert await h.handle(letter(b"\x00\xff not json", "k3")) == "invalid"
    first, second = await rows(pool)
    assert first["execution"] is None  # not trusted into a bigint column
    assert first["attempt"] is None
    assert first["payload"]["payload"]["execution_id"] == 2**70  # but kept as sent
    assert second["payload"] == {"raw": "\\x00\ufffd not json"}


async def test_retention_deletes_records_older_than_ttl(
    pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    h = handler(pool, transport)
    body = m.encode("m1", m.CAPACITY, {"worker_ids": []}, m_now())
    await h.handle(letter(body, "old"))
    await h.handle(letter(body, "new"))
    async with pool.connection() as conn:
        await conn.execute("UPDATE dead_letter SET first_seen = now() - interval '2 hours' WHERE dedupe_key = 'old'")
    assert await h.purge_expired() == 1
    assert [r["dedupe_key"] for r in await rows(pool)] == ["new"]


def m_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
