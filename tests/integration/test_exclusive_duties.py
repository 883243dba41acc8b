"""executor.exclusive_duties: a recovery duty runs on one replica at a time (a session
advisory lock per duty on a connection outside the pool), a replica that dies mid-duty
frees it, and duties ticking together never starve the pool."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.duties import DutyLocks
from conveyor.executor.service import ExecutorService
from conveyor.store.db import connect_sync
from conveyor.transport.postgres import PostgresTransport
from support.polling import until

Pool = AsyncConnectionPool[Any]


@contextlib.asynccontextmanager
async def replicas(pool: Pool, db_url: str, n: int = 1) -> AsyncIterator[list[ExecutorService]]:
    """``n`` executors (not run: their duties are called directly), their lock connections
    closed afterwards."""
    settings = Settings(executor={"exclusive_duties": True})
    made = [ExecutorService(settings, db_url, pool, PostgresTransport(db_url, "conveyor")) for _ in range(n)]
    try:
        yield made
    finally:
        for executor in made:
            assert executor._duty_locks is not None
            await executor._duty_locks.close()


async def test_a_duty_runs_on_one_replica_at_a_time(pool: Pool, db_url: str) -> None:
    async with replicas(pool, db_url, 2) as (a, b):
        await _one_at_a_time(a, b)


async def _one_at_a_time(a: ExecutorService, b: ExecutorService) -> None:
    inside = asyncio.Event()
    leave = asyncio.Event()
    runs: list[str] = []

    async def sweep_a() -> None:
        runs.append("a")
        inside.set()
        await leave.wait()

    async def sweep_b() -> None:
        runs.append("b")

    sweep_a.__name__ = sweep_b.__name__ = "sweep"  # the same duty on two replicas
    first = asyncio.create_task(a._exclusively(sweep_a))
    await asyncio.wait_for(inside.wait(), 10)
    await b._exclusively(sweep_b)  # skipped: a holds the duty
    assert runs == ["a"]
    leave.set()
    await first
    await b._exclusively(sweep_b)  # free again
    assert runs == ["a", "b"]


async def test_a_replica_that_dies_mid_duty_frees_it(pool: Pool, db_url: str) -> None:
    """The lock is held by the dying replica's session: when that session ends (the process
    was SIGKILLed), the next tick of any replica takes the duty."""
    async with replicas(pool, db_url) as (b,):
        await _freed_by_death(b, db_url)


async def _freed_by_death(b: ExecutorService, db_url: str) -> None:
    runs: list[str] = []

    async def sweep() -> None:
        runs.append("b")

    with connect_sync(db_url, "conveyor") as dying:
        dying.execute("SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.duty.sweep', 0))")
        await b._exclusively(sweep)
        assert runs == []
        with connect_sync(db_url, "conveyor", autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (dying.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            dying.execute("SELECT 1")

    async def ran() -> bool:
        await b._exclusively(sweep)
        return bool(runs)

    # The server frees the lock as the terminated backend exits.
    await until(ran, timeout=10, what="the dead replica's duty lock freed")
    assert runs == ["b"]


async def test_duties_ticking_together_do_not_starve_the_pool(db_url: str) -> None:
    """More duties at once than the pool has connections, each needing one: all run. (With
    the lock held on a pool connection, each duty held one and waited for a second until
    the pool timed out -- found by the chaos suite after a PostgreSQL restart.)"""
    pool: Pool = AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False, timeout=5)
    await pool.open()
    try:
        ran: list[str] = []

        def duty(name: str) -> Any:
            async def run() -> None:
                async with pool.connection() as conn:
                    await conn.execute("SELECT pg_sleep(0.05)")
                ran.append(name)

            run.__name__ = name
            return run

        names = [f"duty{i}" for i in range(4)]
        async with replicas(pool, db_url) as (a,):
            await asyncio.wait_for(asyncio.gather(*(a._exclusively(duty(n)) for n in names)), 4)
        assert sorted(ran) == names
    finally:
        await pool.close()


async def test_a_replica_frozen_mid_duty_lets_it_go(db_url: str) -> None:
    """A replica frozen while it holds a duty's lock (here its event loop blocked, as by
    SIGSTOP: no statement leaves the process) loses the lock after frozen_after, so the
    other replicas are not kept from the duty for as long as it is frozen. A replica that
    is only busy keeps it: its session is spoken on every third of the bound."""
    locks = DutyLocks(db_url, "conveyor", "conveyor-executor-duties", frozen_after=0.6)
    seen: dict[str, Any] = {}
    query = (
        "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )

    async def sweep() -> None:
        with connect_sync(db_url, "conveyor", autocommit=True) as other:
            await asyncio.sleep(1.5)  # busy, not frozen: pinged meanwhile
            seen["busy"] = other.execute(query).fetchone()
            time.sleep(1.5)  # noqa: ASYNC251 -- frozen: the event loop blocked, nothing runs in this process
            seen["frozen"] = other.execute(query).fetchone()

    try:
        assert await locks.run(sweep)
    finally:
        await locks.close()
    assert seen == {"busy": {"n": 1}, "frozen": {"n": 0}}
