"""How a worker lets go of its work: when it loses its standing (stop every run, then hand
the stopped ones to recovery) and when it shuts down (drain, then release what is left).

The worker service (service.py) owns one ``Releaser``; its liveness calls it when the
standing is lost and when the worker rejoins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from conveyor.config import Settings
from conveyor.domain.outcome import AttemptEnd, after_interrupted
from conveyor.domain.status import ExecutionStatus, WorkerStatus
from conveyor.store import transitions
from conveyor.store.db import SESSION_ENDED, Pool
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.worker.liveness import Liveness
from conveyor.worker.runs import Runs

log = structlog.get_logger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class Releaser:
    def __init__(
        self,
        name: str,
        pool: Pool,
        runs: Runs,
        liveness: Liveness,
        settings: Settings,
        *,
        spawn: Spawn,  # a task under the worker's task group
    ) -> None:
        self.name = name
        self._pool = pool
        self._runs = runs
        self._liveness = liveness
        self._shutdown_timeout = settings.worker.shutdown_timeout
        self._on_worker_lost = settings.recovery.on_worker_lost
        self._spawn = spawn

    @property
    def worker_id(self) -> int | None:
        return self._liveness.worker_id

    async def stop_everything(self, reason: str) -> None:
        """Stop every execution (process groups killed by the runners); each is remembered
        for release. Those already recovered elsewhere are refused by the fence then."""
        tasks = [run.task for run in self._runs.active() if run.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
            log.warning("stopped executions", count=len(tasks), reason=reason, worker=self.name)

    async def detach_stopped(self) -> None:
        """After losing its standing: hand the stopped executions to the executors' sweep,
        which applies the lost-worker policy (re-run with backoff, or abandon)."""
        stopped = self._runs.stopped()
        if not stopped:
            return
        runs = [(r.execution_id, r.attempt) for r in stopped]
        async with self._pool.connection() as conn:
            rows = await transitions.detach_runs(conn, self.worker_id, runs)
        self._runs.released(stopped)
        log.warning("left stopped executions to recovery", count=len(rows), worker=self.name)

    async def release_interrupted(self) -> None:
        """At shutdown: running -> requested for what was stopped (outcome interrupted), or
        abandoned for actions that must not run twice; fenced on (worker, attempt)."""
        stopped = self._runs.stopped()
        if not stopped:
            return
        decisions = Decisions()
        for run in stopped:
            decisions.add(
                {"id": run.execution_id, "attempt": run.attempt}, after_interrupted(run.metadata, self._on_worker_lost)
            )
        params = decisions.params(
            AttemptEnd.INTERRUPTED, by="worker", from_statuses=(ExecutionStatus.RUNNING,), worker=self.worker_id
        )
        async with self._pool.connection() as conn, conn.transaction():
            rows = await transitions.resolve_attempts(conn, params)
        ended = [r["id"] for r in rows if r["status"] != ExecutionStatus.REQUESTED]
        self._runs.released(stopped)
        log.warning("released interrupted executions", count=len(rows), abandoned=len(ended))

    # -- shutdown ---------------------------------------------------------------------

    async def drain(self, fast_stop: asyncio.Event) -> None:
        """Graceful part of shutdown: no new work, hand back what has not started,
        give running work ``shutdown_timeout`` to finish, then stop and release it."""
        self._liveness.begin_draining()
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(Q["lock_assignment"])  # no dispatch to us can slip in after this
                await transitions.set_worker_status(conn, self.worker_id, WorkerStatus.DRAINING)
                back = await transitions.hand_back_scheduled(conn, self.worker_id)
            if back:
                log.info("handed back scheduled executions", count=len(back))
        except SESSION_ENDED as exc:
            log.warning("cannot hand back scheduled work; recovery will", error=str(exc).strip())
        if active := self._runs.active():
            log.info("waiting for running executions", count=len(active), timeout=self._shutdown_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._shutdown_timeout
        while self._runs.active() and not fast_stop.is_set() and (remaining := deadline - loop.time()) > 0:
            fast = self._spawn(_wait_for(fast_stop), "worker-fast-stop")
            tasks = [run.task for run in self._runs.active() if run.task is not None]
            await asyncio.wait([*tasks, fast], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            fast.cancel()
        await self.stop_everything("shutdown")
        try:
            await self.release_interrupted()
        except SESSION_ENDED as exc:
            log.warning("cannot release stopped executions; recovery will", error=str(exc).strip())


async def _wait_for(event: asyncio.Event) -> None:
    await event.wait()
