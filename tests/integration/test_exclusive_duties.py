"""executor.exclusive_duties: a recovery duty runs on one replica at a time (a
transaction-level advisory lock per duty), and a replica that dies mid-duty frees it."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.service import ExecutorService
from conveyor.store.db import connect_sync
from conveyor.transport.postgres import PostgresTransport

Pool = AsyncConnectionPool[Any]


def replica(pool: Pool, db_url: str) -> ExecutorService:
    settings = Settings(executor={"exclusive_duties": True})
    return ExecutorService(settings, pool, PostgresTransport(db_url, "conveyor"))


async def test_a_duty_runs_on_one_replica_at_a_time(pool: Pool, db_url: str) -> None:
    a, b = replica(pool, db_url), replica(pool, db_url)
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
    b = replica(pool, db_url)
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
    deadline = asyncio.get_running_loop().time() + 10
    while not runs:  # the server frees the lock as the terminated backend exits
        assert asyncio.get_running_loop().time() < deadline, "the dead replica's duty lock was never freed"
        await b._exclusively(sweep)
        await asyncio.sleep(0.02)
    assert runs == ["b"]
