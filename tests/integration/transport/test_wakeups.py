"""Committed transitions wake their listeners themselves, on both transports, whoever made
them (the SDK, the API, an operator's own SQL): the wake-up comes from the database
(``wake()`` fed by triggers, migration 0009), not from a caller that may forget or misroute it.

Regressions: the SDK's cancel of a running execution NOTIFYed a channel a RabbitMQ worker
did not listen to (the worker stopped it only at its next poll); a refusal by a ``cancel``
admission policy sent no ``execution.completed`` message on RabbitMQ; a change made in SQL
woke nobody."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.sdk import Client
from conveyor.store.queries import Q
from conveyor.transport.base import Topic
from integration.builders import make_dispatches, make_worker
from integration.transport_kit import (
    RecordingBell,
    new_transport,
    running,
)
from support.polling import until

Pool = AsyncConnectionPool[Any]
INSERT = "INSERT INTO execution (action_ref) VALUES ('core.noop') RETURNING id"
CANCEL = "UPDATE execution SET status = 'cancelled', ended = now() WHERE id = %s"


async def test_a_cancel_from_the_sdk_rings_the_worker_running_it(settings: Settings, db_url: str, pool: Pool) -> None:
    worker = await make_worker(pool, "w-cancel")
    async with pool.connection() as conn, conn.transaction():
        (eid,) = await make_dispatches(conn, worker)
    async with pool.connection() as conn:  # scheduled -> running on its worker
        assert [r["id"] for r in await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 1}))
                .fetchall()] == [eid]  # fmt: skip
    executor_side = new_transport(settings, db_url, pool, relay=True)  # RabbitMQ: its relay sends
    worker_side = new_transport(settings, db_url, pool, relay=False)
    bell = RecordingBell()
    worker_side.subscribe(Topic.WORKER, worker, bell=bell)
    async with running(executor_side), running(worker_side):
        if settings.transport == "rabbitmq":  # the dispatch's own message, waiting in the queue
            await until(lambda: eid in bell.ids(), what="the dispatch's message delivered")
        bell.rings.clear()  # that, and the wake-up every subscriber gets on connecting
        with Client(db_url) as client:
            assert client.cancel(eid, by="test") == "canceling"
        await until(lambda: bell.rings, what="the worker rung for the cancel", timeout=5)
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT status, cancelled_by FROM execution WHERE id = %s", (eid,))).fetchone()
    assert dict(row) == {"status": "canceling", "cancelled_by": "test"}


async def test_a_refusal_by_a_cancel_policy_tells_the_waiters(settings: Settings, db_url: str, pool: Pool) -> None:
    executor_side = new_transport(settings, db_url, pool, relay=True)
    bell = RecordingBell()
    executor_side.subscribe(Topic.COMPLETED, bell=bell)
    async with running(executor_side):
        with Client(db_url) as client:
            client.set_policy("core.noop", 1, method="cancel")
            held = client.request("core.noop")
            refused = client.request("core.noop")
        await until(lambda: refused in bell.ids(), what="execution.completed for the refused request")
    assert held not in bell.ids()
    with Client(db_url) as client:
        assert client.get(refused).status == "cancelled"


async def test_a_change_made_in_sql_wakes_its_listeners(settings: Settings, db_url: str, pool: Pool) -> None:
    executor_side = new_transport(settings, db_url, pool, relay=True)
    requested, completed = RecordingBell(), RecordingBell()
    executor_side.subscribe(Topic.REQUESTED, bell=requested)
    executor_side.subscribe(Topic.COMPLETED, bell=completed)
    async with running(executor_side):
        requested.rings.clear()
        async with pool.connection() as conn:
            async with conn.transaction():
                row = await (await conn.execute(INSERT)).fetchone()
            assert row is not None
            await until(lambda: requested.rings, what="executors rung for a row inserted by hand")
            async with conn.transaction():
                await conn.execute(CANCEL, (row["id"],))
        await until(lambda: row["id"] in completed.ids(), what="waiters told of a row ended by hand")


async def test_a_rolled_back_change_wakes_nobody(settings: Settings, db_url: str, pool: Pool) -> None:
    executor_side = new_transport(settings, db_url, pool, relay=True)
    completed = RecordingBell()
    executor_side.subscribe(Topic.COMPLETED, bell=completed)
    async with running(executor_side):
        async with pool.connection() as conn:
            async with conn.transaction(force_rollback=True):
                gone = await (await conn.execute(INSERT)).fetchone()
                assert gone is not None
                await conn.execute(CANCEL, (gone["id"],))
            async with conn.transaction():
                kept = await (await conn.execute(INSERT)).fetchone()
                assert kept is not None
                await conn.execute(CANCEL, (kept["id"],))
        await until(lambda: kept["id"] in completed.ids(), what="the committed one")
    assert gone["id"] not in completed.ids()  # published in order: the rolled-back one would be first
