"""The executor process: scheduling rounds woken by the transport, plus the
stale-claim sweep. Safe to run as any number of replicas."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.scheduler import Scheduler
from conveyor.transport.base import Doorbell, Topic, Transport

log = structlog.get_logger(__name__)


def make_executor_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ExecutorService:
    def __init__(self, settings: Settings, pool: AsyncConnectionPool[Any], transport: Transport) -> None:
        self.settings = settings
        self.executor_id = make_executor_id()
        cfg = settings.executor
        self._scheduler = Scheduler(
            pool,
            transport,
            executor_id=self.executor_id,
            batch_size=cfg.batch_size,
            staleness=settings.worker.staleness,
            no_worker_grace=cfg.no_worker_grace,
            unplaceable_check_interval=cfg.poll_interval,
        )
        # Subscribed before the transport starts listening: new requests and freed
        # capacity both mean a round may now place something.
        self._bell = transport.subscribe(Topic.REQUESTED)
        transport.subscribe(Topic.CAPACITY, bell=self._bell)

    async def run(self, stop: asyncio.Event) -> None:
        log.info("executor started", executor=self.executor_id)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_ring_on(stop, self._bell), name="executor-stop-bell")
            tg.create_task(self._schedule_loop(stop), name="executor-schedule")
            tg.create_task(self._reclaim_loop(stop), name="executor-reclaim")
        log.info("executor stopped", executor=self.executor_id)

    async def _schedule_loop(self, stop: asyncio.Event) -> None:
        poll = self.settings.executor.poll_interval
        while not stop.is_set():
            try:
                # Shielded: a round that claimed rows always finishes placing them, so a
                # shutdown never leaves claims behind.
                result = await asyncio.shield(self._scheduler.run_round())
            except psycopg.OperationalError as exc:
                log.warning("scheduling round failed; database unreachable", error=str(exc).strip())
                await _sleep_or_stop(stop, poll)
                continue
            if result.claimed and result.dispatched + result.failed == result.claimed:
                continue  # a full round placed everything: there may be more waiting
            await self._bell.wait(poll)

    async def _reclaim_loop(self, stop: asyncio.Event) -> None:
        cfg = self.settings.executor
        interval = min(cfg.claim_timeout / 2, cfg.timeout_check_interval)
        while not await _sleep_or_stop(stop, interval):
            try:
                await self._scheduler.reclaim_stale(cfg.claim_timeout)
            except psycopg.OperationalError as exc:
                log.warning("stale-claim sweep failed; database unreachable", error=str(exc).strip())


async def _ring_on(stop: asyncio.Event, bell: Doorbell) -> None:
    await stop.wait()
    bell.ring()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; return True if stop was requested."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True
