"""The worker process.

Life cycle: register through its liveness connection (row + lock, see liveness.py) and
publish the actions it offers; then, in one task group, heartbeat, claim what is
dispatched to it (scheduled -> running, guarded by worker), run up to
``max_concurrent_tasks`` at once, and record results in batches fenced by
(execution, worker, attempt).

When it loses its standing (declared dead, or unable to heartbeat) it stops every
execution it runs -- those are being recovered elsewhere -- and rejoins when it can.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

import conveyor
from conveyor.actions.context import ExecutionContext, running
from conveyor.actions.registry import ActionDefinition
from conveyor.config import Settings
from conveyor.domain.errors import ConveyorError
from conveyor.domain.models import ActionResult
from conveyor.domain.policy import RetryPolicy
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions, action_row
from conveyor.transport.base import Doorbell, Topic, Transport
from conveyor.worker.instrument import observe_claims
from conveyor.worker.liveness import Liveness
from conveyor.worker.results import Finished, ResultWriter
from conveyor.worker.runners import run_python, run_subprocess

log = structlog.get_logger(__name__)


_NAME = re.compile(r"[A-Za-z0-9._:@-]{1,200}")


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerService:
    def __init__(
        self,
        settings: Settings,
        url: str,
        pool: AsyncConnectionPool[Any],
        transport: Transport,
        actions: list[ActionDefinition],
    ) -> None:
        self.settings = settings
        self.cfg = settings.worker
        self.name = self.cfg.name or default_worker_name()
        if not _NAME.fullmatch(self.name):
            # Names appear in URLs (/api/v1/workers/{name}/cordon) and queue names.
            raise ConveyorError(f"invalid worker name {self.name!r}: use letters, digits and . _ : @ - (up to 200)")
        self._pool = pool
        self._transport = transport
        self._actions = {a.ref: a for a in actions}
        retry = settings.retry
        self._retry = RetryPolicy(retry.max_attempts, retry.backoff_base, retry.backoff_max, frozenset(retry.retry_on))
        self._threads = ThreadPoolExecutor(
            max_workers=self.cfg.max_concurrent_tasks, thread_name_prefix="conveyor-action"
        )
        # execution id -> (attempt, task) for everything this worker runs now.
        self._running: dict[int, tuple[int, asyncio.Task[None]]] = {}
        # Executions stopped without a result: id -> (attempt, action metadata), to release
        # when the database answers.
        self._to_release: dict[int, tuple[int, dict[str, Any]]] = {}
        self._results = ResultWriter(pool, transport, self.name)
        # A claim failed with the connection: it may have committed all the same.
        self._claim_in_doubt = False
        self._cancelling: set[int] = set()  # stopped because a user cancelled them
        self._next_cancel_check = 0.0
        self._bell = Doorbell()
        self._liveness = Liveness(
            url,
            settings.database.schema_name,
            self.cfg,
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
            on_lost=self._stop_everything,
            on_rejoined=self._detach_stopped,
        )
        self._on_worker_lost = settings.recovery.on_worker_lost

    @property
    def worker_id(self) -> int | None:
        return self._liveness.worker_id

    @property
    def ready(self) -> bool:
        return self._liveness.accepting.is_set()

    async def register(self) -> int:
        """Publish the actions, take the row and the lock, subscribe to the dispatch bell.
        Must run before the transport starts listening."""
        async with self._pool.connection() as conn, conn.transaction():
            for definition in self._actions.values():
                await conn.execute(Q["upsert_action"], action_row(definition))
        worker_id = await self._liveness.start()
        self._results.worker_id = worker_id
        async with self._pool.connection() as conn:
            await self._transport.publish(conn, Topic.CAPACITY)
        self._transport.subscribe(Topic.WORKER, worker_id, bell=self._bell)
        self._liveness.accepting.set()
        log.info("worker registered", worker=self.name, worker_id=worker_id, actions=len(self._actions),
                 capacity=self.cfg.max_concurrent_tasks, stale_after=self.cfg.staleness)  # fmt: skip
        return worker_id

    async def run(self, stop: asyncio.Event, fast_stop: asyncio.Event) -> None:
        assert self.worker_id is not None, "register() first"
        try:
            async with asyncio.TaskGroup() as tg:
                heartbeat = tg.create_task(self._liveness.run(), name="worker-liveness")
                writer = tg.create_task(self._results.run(), name="worker-results")
                await self._claim_loop(stop)
                await self._drain(fast_stop)
                await self._results.flushed(within=max(self.cfg.heartbeat_interval, 5.0))
                writer.cancel()
                heartbeat.cancel()
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)
            await self._liveness.close("inactive")
        log.info("worker stopped", worker=self.name, worker_id=self.worker_id)

    # -- claiming -----------------------------------------------------------------

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        poll = self.cfg.poll_interval
        stop_bell = asyncio.create_task(_ring_on(stop, self._bell))
        try:
            while not stop.is_set():
                free = self.cfg.max_concurrent_tasks - len(self._running)
                claimed = 0
                if free > 0 and self._liveness.accepting.is_set():
                    try:
                        if self._claim_in_doubt:
                            await self._start_unknown_claims()
                        claimed = await self._claim(free)
                    except psycopg.OperationalError as exc:
                        self._claim_in_doubt = True
                        log.warning("claim failed; database unreachable", error=str(exc).strip())
                if self._running and asyncio.get_running_loop().time() >= self._next_cancel_check:
                    self._next_cancel_check = asyncio.get_running_loop().time() + min(poll, 0.25)
                    try:
                        await self._honour_cancellations()
                    except psycopg.OperationalError as exc:
                        log.warning("cancellation check failed; database unreachable", error=str(exc).strip())
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
        observe_claims(rows)
        for row in rows:
            task = asyncio.create_task(self._execute(row), name=f"execution-{row['id']}")
            self._running[row["id"]] = (row["attempt"], task)
        return len(rows)

    async def _honour_cancellations(self) -> None:
        """Executions of this worker whose cancellation was asked (status canceling): stop
        their runs (process groups killed by the runners); the finish records them
        cancelled. One this worker does not run (any more) is finished as cancelled too."""
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["canceling_on_worker"], {"worker": self.worker_id})).fetchall()
        for row in rows:
            eid, attempt = row["id"], row["attempt"]
            entry = self._running.get(eid)
            if entry is not None and entry[0] == attempt:
                if eid not in self._cancelling:
                    self._cancelling.add(eid)
                    entry[1].cancel()
            elif eid not in self._results.pending and eid not in self._to_release:
                self._results.put(_cancelled(eid, attempt))

    async def _start_unknown_claims(self) -> None:
        """After a claim whose commit went unanswered, before any other claim: rows it did
        move to running on this worker would stay there (the worker is alive, so recovery
        leaves them). Nothing ran them: run them now, under the attempt they were claimed for."""
        known = [*self._running, *self._to_release, *self._results.pending]
        async with self._pool.connection() as conn:
            params = {"worker": self.worker_id, "known": known}
            rows = await (await conn.execute(Q["unknown_claims"], params)).fetchall()
        self._claim_in_doubt = False
        for row in rows:
            task = asyncio.create_task(self._execute(row), name=f"execution-{row['id']}")
            self._running[row["id"]] = (row["attempt"], task)
        if rows:
            log.warning("started executions whose claim went unanswered", execution_ids=[r["id"] for r in rows])

    async def _execute(self, row: dict[str, Any]) -> None:
        eid, attempt, ref = row["id"], row["attempt"], row["action_ref"]
        bound = log.bind(execution_id=eid, attempt=attempt, worker=self.name, action=ref)
        bound.debug("execution started")
        try:
            with running(ExecutionContext(eid, attempt, self.name)):  # actions read it with current()
                result = await self._run_action(row)
        except asyncio.CancelledError:
            if eid in self._cancelling:  # a user's cancellation, not this worker stopping
                self._cancelling.discard(eid)
                bound.info("execution cancelled")
                self._results.put(_cancelled(eid, attempt))
                return
            self._to_release[eid] = (attempt, row["metadata"] or {})
            bound.warning("execution stopped on this worker")
            raise
        finally:
            self._running.pop(eid, None)
            self._cancelling.discard(eid)  # a cancel that came after the run ended: the finish records it
            self._bell.ring()  # a slot is free
        outcome = "completed" if result.succeeded else ("timeout" if result.timed_out else "failed")
        delay = None
        if outcome != "completed":
            policy = self._retry.overridden((row["metadata"] or {}).get("retry"))
            delay = policy.next_delay(attempt, outcome)
        status = outcome if delay is None else "requested"
        bound.info("execution finished", status=outcome, duration=round(result.duration, 4),
                   retry_in=round(delay, 3) if delay is not None else None)  # fmt: skip
        self._results.put(Finished(eid, attempt, status, outcome, delay, result.to_json(), result.error, action=ref))

    async def _run_action(self, row: dict[str, Any]) -> ActionResult:
        metadata: dict[str, Any] = row["metadata"] or {}
        timeout = float(metadata.get("timeout") or self.cfg.execution_timeout)
        if row["runner_type"] == "subprocess":
            return await run_subprocess(metadata, row["parameters"], timeout=timeout,
                                        kill_grace=self.cfg.kill_grace, output_limit=self.cfg.output_limit)  # fmt: skip
        definition = self._actions.get(row["action_ref"])
        if definition is None:
            error = f"action {row['action_ref']} has no code on worker {self.name}"
            return ActionResult(succeeded=False, exit_code=None, duration=0.0, error=error)
        return await run_python(definition, row["parameters"], timeout=timeout, executor=self._threads,
                                output_limit=self.cfg.output_limit)  # fmt: skip

    # -- losing work, releasing it ---------------------------------------------------

    async def _stop_everything(self, reason: str) -> None:
        """Stop every execution (process groups killed by the runners); each is remembered
        for release. Those already recovered elsewhere are refused by the fence then."""
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
            log.warning("stopped executions", count=len(tasks), reason=reason, worker=self.name)

    async def _detach_stopped(self) -> None:
        """After losing its standing: hand the stopped executions to the executors' sweep,
        which applies the lost-worker policy (re-run with backoff, or abandon)."""
        if not self._to_release:
            return
        ids = list(self._to_release)
        params = {"ids": ids, "attempts": [self._to_release[i][0] for i in ids], "worker": self.worker_id}
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["detach_runs"], params)).fetchall()
        self._to_release.clear()
        log.warning("left stopped executions to recovery", count=len(rows), worker=self.name)

    async def _release_interrupted(self) -> None:
        """At shutdown: running -> requested for what was stopped (outcome interrupted), or
        abandoned for actions that must not run twice; fenced on (worker, attempt)."""
        if not self._to_release:
            return
        decisions = Decisions()
        for eid, (attempt, metadata) in self._to_release.items():
            abandon = metadata.get("on_worker_lost", self._on_worker_lost) == "abandon"
            status = "abandoned" if abandon else "requested"
            decisions.add({"id": eid, "attempt": attempt}, status, None, "worker shut down")
        params = decisions.params(worker=self.worker_id, outcome="interrupted", by="worker", from_statuses=["running"])
        async with self._pool.connection() as conn, conn.transaction():
            rows = await (await conn.execute(Q["resolve_attempts"], params)).fetchall()
            await self._transport.publish(conn, Topic.REQUESTED)
            ended = [r["id"] for r in rows if r["status"] != "requested"]
            if ended:
                await self._transport.publish(conn, Topic.COMPLETED, execution_ids=ended)
        self._to_release.clear()
        log.warning("released interrupted executions", count=len(rows), abandoned=len(ended))

    # -- shutdown ---------------------------------------------------------------------

    async def _drain(self, fast_stop: asyncio.Event) -> None:
        """Graceful part of shutdown: no new work, hand back what has not started,
        give running work ``shutdown_timeout`` to finish, then stop and release it."""
        self._liveness.begin_draining()
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(Q["lock_assignment"])  # no dispatch to us can slip in after this
                await conn.execute(Q["set_worker_status"], {"id": self.worker_id, "status": "draining"})
                back = await (await conn.execute(Q["hand_back_scheduled"], {"worker": self.worker_id})).fetchall()
                if back:
                    await self._transport.publish(conn, Topic.REQUESTED)
            if back:
                log.info("handed back scheduled executions", count=len(back))
        except psycopg.OperationalError as exc:
            log.warning("cannot hand back scheduled work; recovery will", error=str(exc).strip())
        if self._running:
            log.info("waiting for running executions", count=len(self._running), timeout=self.cfg.shutdown_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.shutdown_timeout
        while self._running and not fast_stop.is_set() and (remaining := deadline - loop.time()) > 0:
            fast = asyncio.ensure_future(fast_stop.wait())
            tasks = [task for _, task in self._running.values()]
            await asyncio.wait([*tasks, fast], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            fast.cancel()
        await self._stop_everything("shutdown")
        try:
            await self._release_interrupted()
        except psycopg.OperationalError as exc:
            log.warning("cannot release stopped executions; recovery will", error=str(exc).strip())


def _cancelled(eid: int, attempt: int) -> Finished:
    result = {"succeeded": False, "error": "cancelled"}
    return Finished(eid, attempt, "cancelled", "cancelled", None, result, "cancelled")


async def _ring_on(stop: asyncio.Event, bell: Doorbell) -> None:
    await stop.wait()
    bell.ring()
