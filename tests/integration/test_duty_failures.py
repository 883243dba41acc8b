"""An executor duty that keeps failing (a bug, not an outage) is reported and fails the
executor's readiness until it succeeds again, instead of looping silently."""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.service import ExecutorService
from conveyor.ops.metrics import DUTY_FAILING
from conveyor.transport.postgres import PostgresTransport
from support.polling import until


async def test_a_failing_duty_fails_readiness_until_it_recovers(pool: AsyncConnectionPool[Any], db_url: str) -> None:
    settings = Settings(executor={"duty_failures_before_unready": 3})
    executor = ExecutorService(settings, db_url, pool, PostgresTransport(db_url, "conveyor"))
    calls: list[int] = []
    broken = True

    async def buggy_duty() -> None:
        calls.append(1)
        if broken:
            raise KeyError("a bug in a duty")

    stop = asyncio.Event()
    task = asyncio.create_task(executor._every(stop, 0.01, buggy_duty))
    try:
        await until(lambda: len(calls) >= 1, timeout=10, what="the duty ran", interval=0.01)
        assert executor.ready  # one failure is retried, not yet reported
        await until(
            lambda: not executor.ready, timeout=10, what="readiness failed after repeated failures", interval=0.01
        )
        assert len(calls) >= 3
        assert executor.failing_duties == ["buggy_duty"]
        assert DUTY_FAILING.labels("buggy_duty")._value.get() == 1
        broken = False
        await until(lambda: executor.ready, timeout=10, what="readiness back once the duty succeeds", interval=0.01)
        assert executor.failing_duties == []
        assert DUTY_FAILING.labels("buggy_duty")._value.get() == 0
    finally:
        stop.set()
        await task
