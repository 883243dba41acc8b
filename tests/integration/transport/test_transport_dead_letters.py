"""One contract, both transports, on the real services: dead letters.

Each test runs on the PostgreSQL transport and on the RabbitMQ transport with the same
assertions: TTL expiry (or, on RabbitMQ, too many deliveries) into dead letters resolved
with guarded transitions, a dead letter for an execution that moved on, a dead-letter
handler interrupted mid-way, and a poison dead letter bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.dead_letters import EXPIRED_ERROR, DeadLetterHandler
from conveyor.executor.service import ExecutorService
from conveyor.store.queries import Q
from conveyor.transport.base import Topic, Transport
from integration.builders import execution, make_dispatches, make_worker
from integration.transport_kit import (
    DyingBell,
    dead_letters,
    new_transport,
    running,
)
from support.polling import until

BACKDATE = "UPDATE execution SET scheduled = now() - interval '1 hour' WHERE id = %s"  # past any TTL


@pytest.mark.parametrize("reschedules", [1, 0])
async def test_expired_dispatch_is_dead_lettered_and_resolved(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any], reschedules: int
) -> None:
    """A worker that looks alive (lock held, heartbeat fresh) but takes nothing: its
    dispatch expires after the TTL, is recorded, and the execution leaves it --
    rescheduled while the bound allows (here onto the same worker, the only one), then
    failed with the seeds' text."""
    settings.executor.scheduled_timeout_reschedules = reschedules
    async with frozen_beside_an_executor(settings, db_url, pool, "frozen") as frozen:
        eid = await dispatch_to(frozen, pool)
        letters = await until(lambda: _resolved(pool, reschedules + 1), what="resolved dead letters")
    worker = frozen.worker
    assert [r["resolution"] for r in letters] == ["rescheduled"] * reschedules + ["failed"]
    for attempt, letter in enumerate(letters, start=1):
        assert letter["reason"] == "expired"
        assert letter["transport"] == settings.transport
        assert letter["execution"] == eid
        assert letter["attempt"] == attempt
        assert letter["worker"] == worker
        assert letter["queue"] == f"{settings.message_queue.prefix}.worker.{worker}.executions"
    row = await execution(pool, eid)
    assert row["status"] == "failed"
    assert row["attempt"] == reschedules + 1
    assert row["result"]["error"] == EXPIRED_ERROR
    assert row["result"]["failed_by"] == "dead_letter_handler"
    async with pool.connection() as conn:
        outcomes = await (
            await conn.execute("SELECT outcome FROM execution_attempt WHERE execution = %s ORDER BY attempt", (eid,))
        ).fetchall()
    assert [o["outcome"] for o in outcomes] == ["expired"] * (reschedules + 1)


@pytest.mark.parametrize("transport_kind", ["rabbitmq"])  # the PostgreSQL transport has no deliveries to count
async def test_a_dispatch_whose_consumers_keep_dying_is_dead_lettered_after_the_delivery_limit(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    """A message that kills every consumer it reaches does not loop for ever: past the
    quorum queue's x-delivery-limit the broker dead-letters it, and the handler records it
    as ``max_redeliveries`` and moves the execution on (rescheduled, per policy)."""
    settings.message_queue.rabbitmq.delivery_limit = 1
    settings.message_queue.rabbitmq.worker_queue_ttl_ms = 60_000  # expiry is not what this is about
    async with frozen_beside_an_executor(settings, db_url, pool, "deadly") as frozen:  # alive all along
        worker = frozen.worker
        eid = await dispatch_to(frozen, pool)
        deaths = 0
        while not await dead_letters(pool):
            assert deaths < 5, "never dead-lettered"
            consumer = new_transport(settings, db_url, pool, relay=False)
            dying = DyingBell()
            dying.armed = dying.spare_wakeups = True
            consumer.subscribe(Topic.WORKER, worker, bell=dying)
            async with running(consumer):
                await until(lambda d=dying: eid in d.ids(), what="a delivery")
            deaths += 1
        (letter,) = await until(lambda: _resolved(pool), what="the dead letter resolved")
    assert letter["reason"] == "max_redeliveries"
    assert (letter["execution"], letter["attempt"], letter["worker"]) == (eid, 1, worker)
    assert letter["resolution"] == "rescheduled"
    assert deaths >= 2  # given back twice, one more than the limit (a third may take the re-dispatch)
    row = await execution(pool, eid)
    assert (row["status"], row["attempt"]) == ("scheduled", 2)


async def _resolved(pool: AsyncConnectionPool[Any], count: int = 1) -> list[dict[str, Any]]:
    rows = await dead_letters(pool)
    return rows if len(rows) >= count and all(r["resolution"] for r in rows) else []


@dataclass
class Frozen:
    """A worker that looks alive (its liveness lock held here, heartbeat fresh) but takes
    nothing, and an executor-side transport with the dead-letter handler attached."""

    worker: int
    transport: Transport
    handler: DeadLetterHandler


@contextlib.asynccontextmanager
async def frozen_worker(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any], name: str
) -> AsyncIterator[Frozen]:
    worker = await make_worker(pool, name)
    async with pool.connection() as holder:
        await holder.execute("SELECT acquire_worker_lock(%s)", (worker,))
        transport = new_transport(settings, db_url, pool, relay=True)
        handler = DeadLetterHandler(pool, transport, settings, "test")
        transport.handle_dead_letters(handler)
        yield Frozen(worker, transport, handler)


@contextlib.asynccontextmanager
async def frozen_beside_an_executor(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any], name: str
) -> AsyncIterator[Frozen]:
    """A frozen worker (see ``frozen_worker``) beside a whole executor service running on
    the transport: its dispatches' dead letters are found and handled as in production."""
    worker = await make_worker(pool, name)
    async with pool.connection() as holder:
        await holder.execute("SELECT acquire_worker_lock(%s)", (worker,))
        transport = new_transport(settings, db_url, pool, relay=True)
        executor = ExecutorService(settings, db_url, pool, transport)
        stop = asyncio.Event()
        async with running(transport):
            service = asyncio.create_task(executor.run(stop))
            try:
                yield Frozen(worker, transport, executor._dead_letters)
            finally:
                stop.set()
                await service


async def dispatch_to(frozen: Frozen, pool: AsyncConnectionPool[Any], *, expired: bool = False) -> int:
    """One dispatch to the frozen worker, published; ``expired``: on PostgreSQL, already
    past the TTL (RabbitMQ's TTL runs from the publish)."""
    async with pool.connection() as conn, conn.transaction():
        (eid,) = await make_dispatches(conn, frozen.worker)
        if expired and frozen.transport.kind == "postgres":
            await conn.execute(BACKDATE, (eid,))
    return eid


async def test_dead_letter_for_an_execution_that_moved_on_is_stale(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    async with frozen_worker(settings, db_url, pool, "moved") as frozen, running(frozen.transport):
        eid = await dispatch_to(frozen, pool)
        async with pool.connection() as conn:  # the worker took it just in time
            await conn.execute(Q["claim_scheduled"], {"worker": frozen.worker, "limit": 10})
        if settings.transport == "postgres":  # what the executor's check would find: nothing
            async with pool.connection() as conn:
                await conn.execute(BACKDATE, (eid,))
            assert await frozen.handler.expire_dispatches() == 0
            return
        letters = await until(lambda: _resolved(pool), what="the expired message handled")
    assert [(r["reason"], r["resolution"]) for r in letters] == [("expired", "stale")]
    assert (await execution(pool, eid))["status"] == "running"


async def test_interrupted_dead_letter_handling_is_done_once(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    """The handler dies while resolving (its connection is terminated while it waits for
    the execution's row lock): nothing is half-done, and the next handler does it once."""
    async with frozen_worker(settings, db_url, pool, "interrupted") as frozen:
        transport, handler = frozen.transport, frozen.handler
        eid = await dispatch_to(frozen, pool, expired=True)
        async with pool.connection() as blocker, running(transport):
            # A plain transaction (not a block) so the lock can be released while the
            # consumer still runs: the broker redelivers the requeued letter at once, and
            # that redelivery must find the row free, not wait on the test's own lock.
            await blocker.execute("SELECT 1 FROM execution WHERE id = %s FOR UPDATE", (eid,))
            if settings.transport == "postgres":
                expiring = asyncio.create_task(handler.expire_dispatches())
            victim = await until(lambda: _waiting_for_lock(pool), what="the handler blocked on the row")
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_terminate_backend(%s)", (victim,))
            if settings.transport == "postgres":
                with pytest.raises(psycopg.OperationalError):
                    await expiring
            else:
                # The requeued letter comes straight back and waits on the row again.
                await until(lambda: _waiting_for_lock(pool, besides=victim), what="the requeued letter redelivered")
            await blocker.rollback()
            # The lock is gone; the dead letter is still to be handled.
            if settings.transport == "postgres":
                assert await handler.expire_dispatches() == 1
            else:  # a redelivery to the next consumer
                await until(lambda: _resolved(pool), what="handled after redelivery")
    letters = await dead_letters(pool)
    assert [(r["reason"], r["resolution"]) for r in letters] == [("expired", "rescheduled")]
    assert (await execution(pool, eid))["status"] == "requested"


async def _waiting_for_lock(pool: AsyncConnectionPool[Any], besides: int = 0) -> int | None:
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND query LIKE '%%FOR UPDATE%%' AND pid <> pg_backend_pid() AND pid <> %s",
                (besides,),
            )
        ).fetchone()
    return int(row["pid"]) if row else None


async def test_poison_dead_letter_is_bounded(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead letter whose handling keeps failing (a bug, not an outage) is tried
    dead_letter.max_deliveries times, then recorded as poison and left for an operator:
    no endless loop, nothing lost."""
    attempts: list[int] = []

    async def broken(self: DeadLetterHandler, conn: Any, dead_letter: Any) -> tuple[str, str]:
        attempts.append(1)
        raise RuntimeError("handler bug")

    monkeypatch.setattr(DeadLetterHandler, "_resolve", broken)
    async with frozen_worker(settings, db_url, pool, "poison") as frozen:
        eid = await dispatch_to(frozen, pool, expired=True)
        async with running(frozen.transport):
            if settings.transport == "postgres":  # the executor's periodic check, run by hand
                for _ in range(5):
                    await frozen.handler.expire_dispatches()
            letters = await until(lambda: dead_letters(pool), what="the poison record")
    limit = settings.dead_letter.max_deliveries
    assert len(attempts) == limit
    (letter,) = letters
    assert letter["reason"] == "poison"
    assert letter["resolution"] is None
    assert letter["execution"] == eid
    assert "RuntimeError: handler bug" in letter["error"]
    assert (await execution(pool, eid))["status"] == "scheduled"  # untouched, for the operator (and the monitor)
