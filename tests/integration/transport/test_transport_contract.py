"""One contract, both transports, on the real services: delivery.

Each test runs on the PostgreSQL transport and on the RabbitMQ transport (outbox, relay,
quorum queues, dead-letter exchange) with the same assertions: publish after commit
only, targeted delivery, delivery to a consumer that starts late, redelivery after a
consumer died holding a message, ordering where promised, duplicate delivery, and the
reconciler publishing again what waits too long. Dead letters: test_transport_dead_letters.py.
"""

from __future__ import annotations

import contextlib
from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.store.queries import Q
from conveyor.transport.base import Topic, Transport
from integration.builders import execution, make_dispatches, make_worker
from integration.transport_kit import (
    DyingBell,
    RecordingBell,
    dead_letters,
    new_transport,
    running,
)
from support.polling import until

# The database publishes (wake()); tests call it directly only to publish twice or roll back.
WAKE_COMPLETED = "SELECT wake('completed', %s::bigint[])"
WAKE_DISPATCHED = "SELECT wake('dispatched', %s::bigint[], %s::bigint[])"


async def test_published_only_when_committed(settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]) -> None:
    transport = new_transport(settings, db_url, pool, relay=True)
    bell = RecordingBell()
    transport.subscribe(Topic.COMPLETED, bell=bell)
    async with running(transport):
        async with pool.connection() as conn:
            with contextlib.suppress(RuntimeError):
                async with conn.transaction():
                    await conn.execute(WAKE_COMPLETED, ([101],))
                    raise RuntimeError("roll back")
            async with conn.transaction():
                await conn.execute(WAKE_COMPLETED, ([102],))
        await until(lambda: 102 in bell.ids(), what="the committed message")
        # Messages of one publisher arrive in order: the rolled-back one would be first.
        assert 101 not in bell.ids()


async def test_dispatch_reaches_only_its_worker(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    w1, w2 = await make_worker(pool, "w1"), await make_worker(pool, "w2")
    executor_side = new_transport(settings, db_url, pool, relay=True)
    worker_side = new_transport(settings, db_url, pool, relay=False)
    bell1, bell2 = RecordingBell(), RecordingBell()
    worker_side.subscribe(Topic.WORKER, w1, bell=bell1)
    worker_side.subscribe(Topic.WORKER, w2, bell=bell2)
    async with running(executor_side), running(worker_side):
        bell1.rings.clear()
        bell2.rings.clear()  # the wake-up every subscriber gets on connecting
        async with pool.connection() as conn, conn.transaction():
            (first,) = await make_dispatches(conn, w1)
        async with pool.connection() as conn, conn.transaction():
            (second,) = await make_dispatches(conn, w2)
        await until(lambda: bell2.rings, what="worker 2 rung")
        await until(lambda: bell1.rings, what="worker 1 rung")
        assert len(bell1.rings) == 1
        assert len(bell2.rings) == 1
        if settings.transport == "rabbitmq":
            assert bell1.ids() == [first]
            assert bell2.ids() == [second]


async def test_consumer_started_late_is_woken(settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]) -> None:
    worker = await make_worker(pool, "late")
    executor_side = new_transport(settings, db_url, pool, relay=True)
    async with running(executor_side):
        if settings.transport == "rabbitmq":  # the queue exists before its worker ever connects
            await new_transport(settings, db_url, pool, relay=False).reconcile()
        async with pool.connection() as conn, conn.transaction():
            (eid,) = await make_dispatches(conn, worker)
        async with pool.connection() as conn:
            await until(
                lambda: _outbox_empty(conn) if settings.transport == "rabbitmq" else True, what="outbox relayed"
            )
        assert await woken_consumer_claims(settings, db_url, pool, worker, eid) == [eid]


async def woken_consumer_claims(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any], worker: int, eid: int
) -> list[int]:
    """A new consumer of ``worker``'s dispatches: it must be rung (on RabbitMQ by ``eid``'s
    own message, which waited in the queue for it); whatever rang it, the worker finds its
    dispatches by reading its rows. Returns the ids it claims."""
    worker_side = new_transport(settings, db_url, pool, relay=False)
    bell = RecordingBell()
    worker_side.subscribe(Topic.WORKER, worker, bell=bell)
    async with running(worker_side):
        await until(lambda: bell.rings, what="the consumer is rung")
        if settings.transport == "rabbitmq":
            await until(lambda: eid in bell.ids(), what="the message waited in its queue for a consumer")
    async with pool.connection() as conn:
        claimed = await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 10})).fetchall()
    return [r["id"] for r in claimed]


async def test_a_consumer_that_dies_mid_delivery_leaves_it_to_the_next(
    settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    """Manual acknowledgement: a dispatch received but not acknowledged by a consumer that
    died is delivered again to the next consumer of that worker's queue (on PostgreSQL the
    row is the message: the next consumer is woken on connecting and finds it)."""
    worker = await make_worker(pool, "dies")
    executor_side = new_transport(settings, db_url, pool, relay=True)
    first = new_transport(settings, db_url, pool, relay=False)
    dying = DyingBell()
    first.subscribe(Topic.WORKER, worker, bell=dying)
    async with running(executor_side):
        async with running(first):
            dying.armed = True
            async with pool.connection() as conn, conn.transaction():
                (eid,) = await make_dispatches(conn, worker)
            await until(lambda: len(dying.rings) > 1, what="the first consumer received the dispatch")
        # The first consumer is gone (its connection closed) without acknowledging.
        assert await woken_consumer_claims(settings, db_url, pool, worker, eid) == [eid]
    assert await dead_letters(pool) == []  # redelivered, not dead-lettered


async def _outbox_empty(conn: Any) -> bool:
    row = await (await conn.execute("SELECT count(*) AS n FROM outbox")).fetchone()
    return bool(row["n"] == 0)


async def test_duplicate_delivery_is_harmless(settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]) -> None:
    worker = await make_worker(pool, "dup")
    executor_side = new_transport(settings, db_url, pool, relay=True)
    worker_side = new_transport(settings, db_url, pool, relay=False)
    bell = RecordingBell()
    worker_side.subscribe(Topic.WORKER, worker, bell=bell)
    async with running(executor_side), running(worker_side):
        bell.rings.clear()
        async with pool.connection() as conn, conn.transaction():
            (eid,) = await make_dispatches(conn, worker)  # published once by the database
            await conn.execute(WAKE_DISPATCHED, ([eid], [worker]))  # and the same dispatch again
        await until(lambda: len(bell.rings) >= (2 if settings.transport == "rabbitmq" else 1), what="both copies")
        async with pool.connection() as conn:
            first = await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 10})).fetchall()
            second = await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 10})).fetchall()
        assert [r["id"] for r in first] == [eid]
        assert second == []
    attempts = await execution(pool, eid)
    assert attempts["status"] == "running"
    assert attempts["attempt"] == 1


async def test_dispatch_order_is_kept(settings: Settings, db_url: str, pool: AsyncConnectionPool[Any]) -> None:
    """Promised: one worker receives its dispatches in the order they were committed
    (RabbitMQ: message order in its queue; PostgreSQL: the claim reads by id)."""
    worker = await make_worker(pool, "order")
    executor_side = new_transport(settings, db_url, pool, relay=True)
    worker_side = new_transport(settings, db_url, pool, relay=False)
    bell = RecordingBell()
    worker_side.subscribe(Topic.WORKER, worker, bell=bell)
    made: list[int] = []
    async with running(executor_side), running(worker_side):
        for _ in range(5):
            async with pool.connection() as conn, conn.transaction():
                ids = await make_dispatches(conn, worker, 20)
            made += ids
        if settings.transport == "rabbitmq":
            await until(lambda: len(bell.ids()) >= len(made), what="every dispatch delivered")
            assert bell.ids() == made
    async with pool.connection() as conn:
        claimed = await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 1000})).fetchall()
    assert [r["id"] for r in claimed] == made


async def test_reconciler_publishes_again_what_waits_too_long(
    rabbitmq_url: str, mq_prefix: str, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    """RabbitMQ only (on PostgreSQL the consumers' polling is the reconciler): a dispatch
    whose message is gone -- here never published, as if the broker lost it -- is
    published again once it has waited past message_queue.reconcile_after."""
    settings = Settings(
        transport="rabbitmq",
        message_queue={"url": rabbitmq_url, "prefix": mq_prefix, "reconcile_after": 0.5},
        executor={"poll_interval": 0.2},
    )
    worker = await make_worker(pool, "forgotten")
    async with pool.connection() as conn, conn.transaction():
        (eid,) = await make_dispatches(conn, worker)  # its message is lost (below)
        await conn.execute("UPDATE execution SET scheduled = now() - interval '1 second' WHERE id = %s", (eid,))
        await conn.execute("INSERT INTO execution (action_ref) VALUES ('core.noop')")  # waits from now on
    async with pool.connection() as conn:
        # Lost: the outbox row written at commit goes too (else the relay published it as
        # soon as it started and the first reconcile had nothing to do: a flake seen in CI).
        await conn.execute("DELETE FROM outbox WHERE execution = %s", (eid,))
    executor_side = new_transport(settings, db_url, pool, relay=True)
    worker_side = new_transport(settings, db_url, pool, relay=False)
    worker_bell, executor_bell = RecordingBell(), RecordingBell()
    worker_side.subscribe(Topic.WORKER, worker, bell=worker_bell)
    executor_side.subscribe(Topic.REQUESTED, bell=executor_bell)
    async with running(executor_side), running(worker_side):
        first = await executor_side.reconcile()
        assert first["scheduled"] == 1
        # The request is republished once it has waited reconcile_after (database clock).
        await until(lambda: _reconciled_requested(executor_side), what="the request republished")
        await until(lambda: eid in worker_bell.ids(), what="the dispatch published again")
        await until(lambda: executor_bell.ids(), what="the old request published again")
        # A message is pending again (the outbox row, until relayed): not published twice over.
        async with pool.connection() as conn:
            await until(lambda: _outbox_empty(conn), what="relayed")


async def _reconciled_requested(transport: Transport) -> bool:
    return (await transport.reconcile()).get("requested", 0) == 1
