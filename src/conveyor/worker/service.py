"""The worker process.

Life cycle: register (upsert by name) and publish the actions it offers; then, in
one task group, heartbeat, claim what is dispatched to it (scheduled -> running,
guarded by worker), run up to ``max_concurrent_tasks`` at once, and record results
in batches fenced by (execution, worker, attempt).
"""

from __future__ import annotations

import asyncio
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

import conveyor
from conveyor.actions.registry import ActionDefinition
from conveyor.config import Settings
from conveyor.domain.models import ActionResult
from conveyor.store.queries import Q
from conveyor.store.rows import action_row
from conveyor.transport.base import Doorbell, Topic, Transport
from conveyor.worker.runners import run_python, run_subprocess

log = structlog.get_logger(__name__)

# Completions are written in batches of at most this many rows per statement.
_FINISH_BATCH = 500


@dataclass(frozen=True, slots=True)
class Finished:
    execution_id: int
    attempt: int
    status: str
    result: dict[str, Any]
    error: str | None


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerService:
    def __init__(
        self, settings: Settings, pool: AsyncConnectionPool[Any], transport: Transport, actions: list[ActionDefinition]
    ) -> None:
        self.settings = settings
        self.cfg = settings.worker
        self.name = self.cfg.name or default_worker_name()
        self._pool = pool
        self._transport = transport
        self._actions = {a.ref: a for a in actions}
        self._threads = ThreadPoolExecutor(
            max_workers=self.cfg.max_concurrent_tasks, thread_name_prefix="conveyor-action"
        )
        self._running: dict[int, asyncio.Task[None]] = {}
        self._done: asyncio.Queue[Finished] = asyncio.Queue()
        self._bell = Doorbell()
        self.worker_id: int | None = None

    async def register(self) -> int:
        """Upsert the worker row and the actions it offers; subscribe to its dispatch bell.
        Must run before the transport starts listening."""
        async with self._pool.connection() as conn, conn.transaction():
            for definition in self._actions.values():
                await conn.execute(Q["upsert_action"], action_row(definition))
            found = await (
                await conn.execute(
                    Q["register_worker"],
                    {
                        "name": self.name,
                        "runtimes": self.cfg.runtimes,
                        "actions": sorted(ref for ref, a in self._actions.items() if a.runner_type == "python"),
                        "capabilities": Jsonb({"max_concurrent_tasks": self.cfg.max_concurrent_tasks}),
                        "capacity": self.cfg.max_concurrent_tasks,
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "version": conveyor.__version__,
                    },
                )
            ).fetchone()
            assert found is not None
            self.worker_id = int(found["id"])
            await self._transport.publish(conn, Topic.CAPACITY)
        self._transport.subscribe(Topic.WORKER, self.worker_id, bell=self._bell)
        log.info(
            "worker registered",
            worker=self.name,
            worker_id=self.worker_id,
            actions=len(self._actions),
            capacity=self.cfg.max_concurrent_tasks,
        )
        return self.worker_id

    async def run(self, stop: asyncio.Event, fast_stop: asyncio.Event) -> None:
        assert self.worker_id is not None, "register() first"
        try:
            async with asyncio.TaskGroup() as tg:
                heartbeat = tg.create_task(self._heartbeat_loop(), name="worker-heartbeat")
                finisher = tg.create_task(self._finish_loop(), name="worker-finish")
                await self._claim_loop(stop)
                await self._drain(fast_stop)
                await self._done.join()  # every result written
                heartbeat.cancel()
                finisher.cancel()
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)
        await self._set_status("inactive")
        log.info("worker stopped", worker=self.name, worker_id=self.worker_id)

    # -- claiming -----------------------------------------------------------------

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        poll = self.cfg.poll_interval
        stop_bell = asyncio.create_task(_ring_on(stop, self._bell))
        try:
            while not stop.is_set():
                free = self.cfg.max_concurrent_tasks - len(self._running)
                claimed = 0
                if free > 0:
                    try:
                        claimed = await self._claim(free)
                    except psycopg.OperationalError as exc:
                        log.warning("claim failed; database unreachable", error=str(exc).strip())
                if claimed and claimed == free:
                    continue
                await self._bell.wait(poll)
        finally:
            stop_bell.cancel()

    async def _claim(self, limit: int) -> int:
        # Pipelined: BEGIN and the claim travel together; the commit is flushed before
        # anything runs (a claim lost in a crash must not leave an action running).
        async with self._pool.connection() as conn, conn.pipeline(), conn.transaction():
            rows = await (
                await conn.execute(Q["claim_scheduled"], {"worker": self.worker_id, "limit": limit})
            ).fetchall()
        for row in rows:
            task = asyncio.create_task(self._execute(row), name=f"execution-{row['id']}")
            self._running[row["id"]] = task
        return len(rows)

    async def _execute(self, row: dict[str, Any]) -> None:
        eid, attempt, ref = row["id"], row["attempt"], row["action_ref"]
        bound = log.bind(execution_id=eid, attempt=attempt, worker=self.name, action=ref)
        bound.debug("execution started")
        try:
            result = await self._run_action(row)
        finally:
            self._running.pop(eid, None)
            self._bell.ring()  # a slot is free
        status = "completed" if result.succeeded else ("timeout" if result.timed_out else "failed")
        bound.info("execution finished", status=status, duration=round(result.duration, 4))
        self._done.put_nowait(Finished(eid, attempt, status, result.to_json(), result.error))

    async def _run_action(self, row: dict[str, Any]) -> ActionResult:
        metadata: dict[str, Any] = row["metadata"] or {}
        timeout = float(metadata.get("timeout") or self.cfg.execution_timeout)
        if row["runner_type"] == "subprocess":
            return await run_subprocess(
                metadata,
                row["parameters"],
                timeout=timeout,
                kill_grace=self.cfg.kill_grace,
                output_limit=self.cfg.output_limit,
            )
        definition = self._actions.get(row["action_ref"])
        if definition is None:
            return ActionResult(
                succeeded=False,
                exit_code=None,
                duration=0.0,
                error=f"action {row['action_ref']} has no code on worker {self.name}",
            )
        return await run_python(definition, row["parameters"], timeout=timeout, executor=self._threads)

    # -- results ------------------------------------------------------------------

    async def _finish_loop(self) -> None:
        while True:
            batch = [await self._done.get()]
            while len(batch) < _FINISH_BATCH and not self._done.empty():
                batch.append(self._done.get_nowait())
            await self._write_results(batch)
            for _ in batch:
                self._done.task_done()

    async def _write_results(self, batch: list[Finished]) -> None:
        delay = 0.1
        while True:
            try:
                # Pipelined: the update and its wake-ups go in one round trip with the
                # commit. The wake-up names every id of the batch; waiters re-read rows.
                async with self._pool.connection() as conn, conn.pipeline():
                    async with conn.transaction():
                        cursor = await conn.execute(
                            Q["finish"],
                            {
                                "worker": self.worker_id,
                                "ids": [f.execution_id for f in batch],
                                "attempts": [f.attempt for f in batch],
                                "statuses": [f.status for f in batch],
                                "results": [Jsonb(f.result) for f in batch],
                                "errors": [f.error for f in batch],
                            },
                        )
                        ids = [f.execution_id for f in batch]
                        await self._transport.publish(conn, Topic.COMPLETED, execution_ids=ids)
                        await self._transport.publish(conn, Topic.CAPACITY)
                    written = {r["id"] for r in await cursor.fetchall()}
                break
            except psycopg.OperationalError as exc:
                # Results are kept in memory and retried: the execution rows stay
                # `running` meanwhile, which recovery (not this loop) arbitrates.
                log.warning("cannot record results; retrying", error=str(exc).strip(), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        for f in batch:
            if f.execution_id not in written:
                log.warning(
                    "late result refused: the execution moved on without this attempt",
                    execution_id=f.execution_id,
                    attempt=f.attempt,
                    worker=self.name,
                )

    # -- liveness and shutdown ------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_interval)
            try:
                async with self._pool.connection() as conn:
                    await conn.execute(Q["heartbeat"], {"id": self.worker_id})
            except psycopg.OperationalError as exc:
                log.warning("heartbeat failed; database unreachable", error=str(exc).strip())

    async def _drain(self, fast_stop: asyncio.Event) -> None:
        """Graceful part of shutdown: no new work, hand back what has not started,
        give running work ``shutdown_timeout`` to finish, then cancel it."""
        await self._set_status("draining")
        async with self._pool.connection() as conn, conn.transaction():
            back = await (await conn.execute(Q["hand_back_scheduled"], {"worker": self.worker_id})).fetchall()
            if back:
                await self._transport.publish(conn, Topic.REQUESTED)
        if back:
            log.info("handed back scheduled executions", count=len(back))
        if self._running:
            log.info("waiting for running executions", count=len(self._running), timeout=self.cfg.shutdown_timeout)
        deadline = asyncio.get_running_loop().time() + self.cfg.shutdown_timeout
        while self._running and not fast_stop.is_set():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            fast = asyncio.ensure_future(fast_stop.wait())
            await asyncio.wait([*self._running.values(), fast], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            fast.cancel()
        leftover = [t for t in self._running.values() if not t.done()]
        for task in leftover:
            task.cancel()
        if leftover:
            await asyncio.gather(*leftover, return_exceptions=True)
            await self._release_running()

    async def _release_running(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            rows = await (await conn.execute(Q["release_running"], {"worker": self.worker_id})).fetchall()
            if rows:
                await self._transport.publish(conn, Topic.REQUESTED)
        log.warning("released interrupted executions for another attempt", count=len(rows))

    async def _set_status(self, status: str) -> None:
        try:
            async with self._pool.connection() as conn:
                await conn.execute(Q["set_worker_status"], {"id": self.worker_id, "status": status})
        except psycopg.OperationalError as exc:
            log.warning("cannot record worker status", status=status, error=str(exc).strip())


async def _ring_on(stop: asyncio.Event, bell: Doorbell) -> None:
    await stop.wait()
    bell.ring()
