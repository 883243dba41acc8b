"""Shared by the tests of the transports (contract, wake-ups): recording doorbells, a
running transport, a consumer that dies mid-delivery, and the dead letters recorded.
The ``route`` and ``settings`` fixtures are in transport/conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.transport import make_transport
from conveyor.transport.base import Doorbell, Transport

TIMEOUT = 20.0


class RecordingBell(Doorbell):
    def __init__(self) -> None:
        super().__init__()
        self.rings: list[str] = []

    def ring(self, payload: str = "") -> None:
        self.rings.append(payload)
        super().ring(payload)

    def ids(self) -> list[int]:
        return [int(p) for ring in self.rings for p in ring.split(",") if p]


def declare_route(transport_kind: str, db_url: str) -> None:
    """The database publishes for the transport under test (as services declare at start)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT conveyor.set_transport_route(%s)", (transport_kind,))


def transport_settings(transport_kind: str, request: pytest.FixtureRequest) -> Settings:
    """Settings of the transport under test, with short intervals."""
    mq: dict[str, Any] = {}
    if transport_kind == "rabbitmq":
        mq = {"url": request.getfixturevalue("rabbitmq_url"), "prefix": request.getfixturevalue("mq_prefix")}
    return Settings(
        transport=transport_kind,
        message_queue={**mq, "rabbitmq": {"worker_queue_ttl_ms": 600, "worker_queue_expires_ms": 60_000}},
        dead_letter={"check_interval": 0.1, "max_deliveries": 3},
        executor={"poll_interval": 0.2, "scheduled_timeout_reschedules": 1, "timeout_check_interval": 3600},
        recovery={"sweep_interval": 3600, "watch_interval": 3600},
    )


@contextlib.asynccontextmanager
async def running(transport: Transport) -> AsyncIterator[Transport]:
    ready = asyncio.Event()
    task = asyncio.create_task(transport.run(ready))
    try:
        async with asyncio.timeout(TIMEOUT):
            await ready.wait()
            while True:  # the broker too (services need not wait for it)
                if transport.connected:
                    break
                await asyncio.sleep(0.02)
        yield transport
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def new_transport(settings: Settings, db_url: str, pool: AsyncConnectionPool[Any], *, relay: bool) -> Transport:
    return make_transport(settings, db_url, pool, relay=relay, application_name="contract-test")


class DyingBell(RecordingBell):
    """Once armed, the consumer dies at its next delivery, after receiving it and before
    acknowledging it: the task handling it is cancelled, as the process ending would stop it."""

    armed = False
    spare_wakeups = False  # die only on a message naming executions, not on a bare wake-up

    def ring(self, payload: str = "") -> None:
        super().ring(payload)
        if self.armed and (payload or not self.spare_wakeups):
            raise asyncio.CancelledError  # the consumer's task stops here, before its acknowledgement


async def dead_letters(pool: AsyncConnectionPool[Any]) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return [dict(r) for r in await (await conn.execute("SELECT * FROM dead_letter ORDER BY id")).fetchall()]
