"""The executor's schedule loop (issue #13): it sleeps until the earliest next fire time
(database clock), so slots fire within milliseconds of their time even with a long
schedules.poll_interval; a schedule created while it sleeps wakes it (Topic.SCHEDULE);
a buffered slot fires soon after the run it waited for ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.schedules import Firer
from conveyor.executor.service import ExecutorService
from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, add_worker, client_of
from support.polling import until


@pytest.fixture
async def executor(
    db_url: str, pool: AsyncConnectionPool[Any], transport: PostgresTransport, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[list[float]]:
    """A running executor; yields how long each idle slots pass chose to sleep, so a test
    can wait until the executor is asleep rather than guess how long its first pass takes."""
    sleeps: list[float] = []
    real_until_next = Firer.until_next

    async def until_next(self: Firer, poll: float) -> float:
        wait = await real_until_next(self, poll)
        sleeps.append(wait)
        return wait

    monkeypatch.setattr(Firer, "until_next", until_next)
    settings = Settings()
    settings.schedules.poll_interval = 30.0  # far longer than a slot: only the exact sleep fires them on time
    service = ExecutorService(settings, db_url, pool, transport)
    stop, ready = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(transport.run(ready))
    await asyncio.wait_for(ready.wait(), 10)
    task = asyncio.create_task(service.run(stop))
    try:
        yield sleeps
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        listener.cancel()


def lags(conn: Conn, name: str) -> list[float]:
    rows = conn.execute(
        "SELECT extract(epoch FROM ss.fired - ss.slot)::float8 AS lag FROM schedule_slot ss "
        "JOIN schedule s ON s.id = ss.schedule WHERE s.name = %s AND ss.origin = 'scheduled' ORDER BY ss.slot",
        (name,),
    ).fetchall()
    return [r["lag"] for r in rows]


async def test_slots_fire_on_time(conn: Conn, executor: list[float]) -> None:
    # The first pass found nothing and the executor sleeps (up to 30 s): only the wake-up
    # of the schedules created now can fire their slots on time.
    await until(lambda: executor, timeout=10, what="the executor's first slots pass")
    with client_of(conn) as client:
        client.create_schedule("tick", every=1, action="core.noop")
        client.create_schedule("secs", cron="*/2 * * * * *", action="core.noop")
    await until(lambda: len(lags(conn, "tick")) >= 3 and len(lags(conn, "secs")) >= 2, timeout=8, what="slots")
    for name in ("tick", "secs"):
        assert all(0 <= lag < 0.25 for lag in lags(conn, name)), (name, lags(conn, name))


@pytest.mark.usefixtures("executor")
async def test_buffered_slot_fires_when_the_previous_run_ends(conn: Conn) -> None:
    add_worker(conn, "w1")  # takes the runs and never ends them: the first one is still going
    with client_of(conn) as client:
        client.create_schedule("busy", every=1, action="core.noop", overlap="buffer_one")

    def outcomes() -> list[str]:
        return [r["outcome"] for r in conn.execute("SELECT outcome FROM schedule_slot ORDER BY slot").fetchall()]

    await until(lambda: outcomes()[:3] == ["requested", "buffered", "skipped"], timeout=8, what="a buffered slot")
    first = conn.execute("SELECT execution FROM schedule_slot ORDER BY slot LIMIT 1").fetchone()
    assert first is not None
    conn.execute("SELECT cancel_execution(%s, 'test')", (first["execution"],))
    await until(lambda: outcomes()[1] == "requested", timeout=5, what="the buffered slot fired")
