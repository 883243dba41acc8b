"""The worker process.

Life cycle: register through its liveness connection (row + lock, see liveness.py) and
publish the actions it offers; then, in one task group, heartbeat, claim what is
dispatched to it (scheduled -> running, guarded by worker), run up to
``max_concurrent_tasks`` at once, and record results in batches fenced by
(execution, worker, attempt).

Executors place up to ``worker.prefetch`` executions on it beyond its slots. The
transaction that records results claims from those for the slots it frees (results.py),
so at a small concurrency a slot waits neither for a scheduling round nor for a second
commit. Claims come from two places, this claim loop (woken by dispatches) and the
result writer: ``_reserved`` counts the slots a claim in flight may fill, so that the
two together never start more than ``max_concurrent_tasks``.

When it loses its standing (declared dead, or unable to heartbeat) it stops every
execution it runs -- those are being recovered elsewhere -- and rejoins when it can.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

import conveyor
from conveyor.actions.context import ExecutionContext, running
from conveyor.actions.registry import ActionDefinition
from conveyor.config import Settings
from conveyor.domain.errors import ConveyorError
from conveyor.domain.models import ActionResult
from conveyor.domain.outcome import AttemptEnd, after_run, cancelled
from conveyor.domain.policy import RetryPolicy
from conveyor.domain.status import InactiveReason
from conveyor.store import transitions
from conveyor.store.db import SESSION_ENDED, Pool, log_operational
from conveyor.store.queries import Q
from conveyor.store.rows import ClaimedRun
from conveyor.transport.base import Doorbell, Topic, Transport
from conveyor.verbs import actions
from conveyor.verbs.drive import run_async
from conveyor.worker.instrument import observe_claims
from conveyor.worker.liveness import Liveness
from conveyor.worker.naming import default_worker_name
from conveyor.worker.output import OutputWriter
from conveyor.worker.releasing import Releaser
from conveyor.worker.results import Finished, ResultWriter
from conveyor.worker.runners import run_python, run_subprocess
from conveyor.worker.runners.isolated import Lease, entry_point, preload, run_isolated, warm_up
from conveyor.worker.runs import Ran, Run, Runs, RunState

log = structlog.get_logger(__name__)


_NAME = re.compile(r"[A-Za-z0-9._:@-]{1,200}")


class WorkerService:
    def __init__(
        self,
        settings: Settings,
        direct_url: str,  # the liveness session's (database.direct_url): never through a pooler
        pool: Pool,
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
        # One record per run, from its claim until its result is handed to the writer or,
        # stopped without one, it is released (runs.py).
        self._runs = Runs()
        self._ran = Ran()  # what this process started: a forgotten result is told from an unknown claim
        self._tasks: asyncio.TaskGroup | None = None  # supervises every task of run()
        self._results = ResultWriter(pool, self.name, refill=self, retry_max=settings.database.reconnect_interval)
        self._output = OutputWriter(pool, self.name, limit=self.cfg.output_limit, interval=self.cfg.output_interval)
        # A claim failed with the connection: it may have committed all the same.
        self._claim_in_doubt = False
        self._reserved = 0  # slots a claim in flight may fill
        self._stop: asyncio.Event | None = None
        self._next_cancel_check = 0.0
        self._bell = Doorbell()
        self._lease = Lease(self.cfg.self_fence_after)
        # The fork server imports the modules of the actions that may run isolated, once.
        preload(name.partition(":")[0] for a in actions if a.runner_type == "python" and (name := entry_point(a)))
        self._liveness = Liveness(
            direct_url,
            settings.database.schema_name,
            self.cfg,
            {
                "name": self.name,
                "runtimes": self.cfg.runtimes,
                "actions": sorted(ref for ref, a in self._actions.items() if a.runner_type == "python"),
                "capabilities": Jsonb(
                    {"max_concurrent_tasks": self.cfg.max_concurrent_tasks, "prefetch": self.cfg.prefetched}
                ),
                "capacity": self.cfg.max_concurrent_tasks,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "version": conveyor.__version__,
            },
            # The releaser is made next: it lets go of the work through this liveness.
            on_lost=lambda reason: self._releaser.stop_everything(reason),
            on_rejoined=lambda: self._releaser.detach_stopped(),
            on_new_server=self._server_changed,
            lease=self._lease,
        )
        self._releaser = Releaser(self.name, pool, self._runs, self._liveness, settings, spawn=self._spawn)

    @property
    def worker_id(self) -> int | None:
        return self._liveness.worker_id

    @property
    def ready(self) -> bool:
        return self._liveness.accepting.is_set()

    async def register(self) -> int:
        """Publish the actions, take the row and the lock, subscribe to the dispatch bell.
        Must run before the transport starts listening."""
        async with self._pool.connection() as conn:
            await run_async(conn, actions.offer(self._actions.values()))
        if self.cfg.isolation == "process" or any(
            a.metadata.get("isolation") == "process" for a in self._actions.values()
        ):
            await asyncio.to_thread(warm_up)
        worker_id = await self._liveness.start()
        self._results.worker_id = self._output.worker_id = worker_id
        self._transport.subscribe(Topic.WORKER, worker_id, bell=self._bell)
        self._liveness.accepting.set()
        log.info(
            "worker registered",
            worker=self.name,
            worker_id=worker_id,
            actions=len(self._actions),
            capacity=self.cfg.max_concurrent_tasks,
            stale_after=self.cfg.staleness,
        )
        return worker_id

    async def run(self, stop: asyncio.Event, fast_stop: asyncio.Event) -> None:
        assert self.worker_id is not None, "register() first"
        self._stop = stop
        try:
            async with asyncio.TaskGroup() as tg:
                self._tasks = tg
                heartbeat = tg.create_task(self._liveness.run(), name="worker-liveness")
                writer = tg.create_task(self._results.run(), name="worker-results")
                output = tg.create_task(self._output.run(), name="worker-output")
                await self._claim_loop(stop)
                await self._releaser.drain(fast_stop)
                await self._results.flushed(within=max(self.cfg.heartbeat_interval, 5.0))
                writer.cancel()
                output.cancel()
                heartbeat.cancel()
        finally:
            self._tasks = None
            self._threads.shutdown(wait=False, cancel_futures=True)
            await self._liveness.close(InactiveReason.STOPPED)
        log.info("worker stopped", worker=self.name, worker_id=self.worker_id)

    # -- claiming -----------------------------------------------------------------

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        poll = self.cfg.poll_interval
        stop_bell = self._spawn(_ring_on(stop, self._bell), "worker-stop-bell")
        try:
            while not stop.is_set():
                # Slots whose results wait to be written are the writer's to fill.
                free = self._free_slots() - self._results.queued
                claimed = 0
                # An in-doubt claim is looked for only while no other claim is in flight:
                # rows that one commits would look unknown (and run twice).
                if free > 0 and self._liveness.accepting.is_set() and not (self._claim_in_doubt and self._reserved):
                    try:
                        if self._claim_in_doubt:
                            await self._start_unknown_claims()
                        claimed = await self._claim(free)
                    except SESSION_ENDED as exc:
                        self._claim_in_doubt = True
                        log_operational(log, "claim", exc)
                if self._runs.active() and asyncio.get_running_loop().time() >= self._next_cancel_check:
                    self._next_cancel_check = asyncio.get_running_loop().time() + min(poll, 0.25)
                    try:
                        await self._honour_cancellations()
                    except SESSION_ENDED as exc:
                        log_operational(log, "cancellation check", exc)
                if claimed and claimed == free:
                    continue
                await self._bell.wait(poll)
        finally:
            stop_bell.cancel()

    async def _claim(self, limit: int) -> int:
        # Pipelined: BEGIN and the claim travel together; the commit is flushed before
        # anything runs (a claim lost in a crash must not leave an action running).
        self._reserved += limit
        try:
            async with self._pool.connection() as conn, conn.pipeline(), conn.transaction():
                cursor = await transitions.claim_scheduled(conn, self.worker_id, limit)
                rows: list[ClaimedRun] = await cursor.fetchall()
        except BaseException:  # nothing claimed (or in doubt: the caller sees to that)
            self._reserved -= limit
            raise
        # Not claimed(): its ring after a short claim would wake this loop at once, to
        # claim again and come back short again -- a busy loop while nothing waits.
        self._took(rows, limit)
        return len(rows)

    def _free_slots(self) -> int:
        return self.cfg.max_concurrent_tasks - len(self._runs.active()) - self._reserved

    def reserve(self) -> int:
        """The result writer's claim (results.Refill): the slots free now, reserved."""
        stopping = self._stop is None or self._stop.is_set()
        if stopping or not self._liveness.accepting.is_set():
            return 0
        if self._claim_in_doubt:
            self._bell.ring()  # the claim loop resolves it first
            return 0
        free = max(0, self._free_slots())
        self._reserved += free
        return free

    def claimed(self, rows: list[ClaimedRun], reserved: int, *, in_doubt: bool = False) -> None:
        """The result writer's claim came back (results.Refill): ``reserved`` slots were
        reserved for it, ``rows`` were claimed."""
        if in_doubt:
            self._claim_in_doubt = True
        self._took(rows, reserved)
        if in_doubt or len(rows) < reserved:
            # Slots still free: the claim loop looks again (a dispatch it was rung for
            # while they were reserved may have committed after this claim's snapshot).
            self._bell.ring()

    def _took(self, rows: list[ClaimedRun], reserved: int) -> None:
        """The tail of both claims: the reservation given back, the rows started."""
        self._reserved -= reserved
        observe_claims(rows)
        for row in rows:
            self._start(row)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task under run()'s task group: none is left running or loses its exception."""
        if self._tasks is None:
            coro.close()
            raise RuntimeError("the worker is not running")
        return self._tasks.create_task(coro, name=name)

    def _start(self, row: ClaimedRun) -> None:
        if self._runs.get(row.id, row.attempt) is not None:
            # Claimed again while it runs: the database went back to before this run's
            # claim (a failover lost it). The run goes on; its result completes the row.
            log.warning(
                "claimed an execution this worker already runs; not starting it twice",
                execution_id=row.id,
                attempt=row.attempt,
                worker=self.name,
            )
            return
        self._ran.add((row.id, row.attempt))
        run = self._runs.add(row.id, row.attempt, row.settings)
        run.task = self._spawn(self._execute(run, row), f"execution-{row.id}")
        run.task.add_done_callback(lambda task: self._cancelled_before_start(run, task))

    def _cancelled_before_start(self, run: Run, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never enters ``_execute``: neither its
        ``except CancelledError`` nor its ``finally`` runs. Without this, a run claimed just
        before the worker lost its standing (or a user's cancel landed) stayed "running" in
        the worker's books -- never released to recovery, never recorded, holding a slot --
        and in the database, on a worker that is alive, so no sweep ever took it back (found
        by the chaos suite). Registered before anyone else awaits the task, so it runs
        before ``Releaser.stop_everything``'s gather returns."""
        if not task.cancelled() or self._runs.get(run.execution_id, run.attempt) is not run:
            return  # it ran: _execute settled its books
        if run.state is RunState.CANCELLING:  # a user's cancel: recorded cancelled, as _execute does
            self._runs.finished(run)
            self._results.put(_cancelled(run.execution_id, run.attempt))
        else:  # this worker stopping it: released like any stopped run
            run.state = RunState.STOPPED
        self._bell.ring()

    async def _honour_cancellations(self) -> None:
        """Executions of this worker whose cancellation was asked (status canceling): stop
        their runs (process groups killed by the runners); the finish records them
        cancelled. One this worker does not run (any more) is finished as cancelled too."""
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["canceling_on_worker"], {"worker": self.worker_id})).fetchall()
        for row in rows:
            eid, attempt = row["id"], row["attempt"]
            run = self._runs.get(eid, attempt)
            if run is not None:
                run.cancel()  # once; a stopped run is released instead
            elif eid not in self._results.pending:
                self._results.put(_cancelled(eid, attempt))

    def _server_changed(self) -> None:
        """Registered with another server lifetime (a restart, or a failover): look, as
        after an unanswered claim, for rows running here that this worker does not know."""
        self._claim_in_doubt = True
        self._bell.ring()

    async def _start_unknown_claims(self) -> None:
        """After a claim whose commit went unanswered (or a new server), before any other
        claim: rows it did move to running on this worker would stay there (the worker is
        alive, so recovery leaves them). Nothing ran them: run them now, under the attempt
        they were claimed for. Those this process did run had their result forgotten by
        the database (a failover to a standby that lacked it): run again under the same
        attempt they would run twice unseen, left running they would be stuck -- they are
        left to recovery, which applies the lost-worker policy (a new attempt, or abandoned)."""
        known = [*self._runs.ids(), *self._results.pending]
        async with self._pool.connection() as conn:
            params = {"worker": self.worker_id, "known": known}
            cursor = conn.cursor(row_factory=class_row(ClaimedRun))
            await cursor.execute(Q["unknown_claims"], params)
            rows: list[ClaimedRun] = await cursor.fetchall()
            forgotten = [r for r in rows if (r.id, r.attempt) in self._ran]
            if forgotten:
                await transitions.detach_runs(conn, self.worker_id, [(r.id, r.attempt) for r in forgotten])
                log.error(
                    "the database forgot results this worker wrote (a failover to a standby that "
                    "lacked them); left to recovery",
                    execution_ids=[r.id for r in forgotten],
                    worker=self.name,
                )
        rows = [r for r in rows if (r.id, r.attempt) not in self._ran]
        self._claim_in_doubt = False
        for row in rows:
            self._start(row)
        if rows:
            log.warning("started executions whose claim went unanswered", execution_ids=[r.id for r in rows])

    async def _execute(self, run: Run, row: ClaimedRun) -> None:
        eid, attempt, ref = row.id, row.attempt, row.action_ref
        bound = log.bind(execution_id=eid, attempt=attempt, worker=self.name, action=ref)
        bound.debug("execution started")
        out = self._output.open(eid, attempt)  # live output, sent as it comes
        try:
            with running(ExecutionContext(eid, attempt, self.name, out.emitter())):  # actions read it with current()
                result = await self._run_action(row, out.write)
        except asyncio.CancelledError:
            if run.state is RunState.CANCELLING:  # a user's cancellation, not this worker stopping
                bound.info("execution cancelled")
                await self._output.close(out)
                self._results.put(_cancelled(eid, attempt))
                return
            run.state = RunState.STOPPED  # kept until released
            self._output.forget(out)
            bound.warning("execution stopped on this worker")
            raise
        except Exception as exc:  # supervision: one run's failure must not take the worker (and its runs) down
            bound.exception("running the action failed inside the worker")
            error = f"the worker failed running this action: {type(exc).__name__}: {exc}"
            result = ActionResult(succeeded=False, exit_code=None, duration=0.0, error=error)
        finally:
            self._runs.finished(run)  # a cancel that came after the run ended: the finish records it
            if run.state is RunState.STOPPED:
                self._bell.ring()  # a slot is free (otherwise the writer claims for it with the result)
        end = AttemptEnd.TIMEOUT if result.timed_out else AttemptEnd.FAILED
        end = AttemptEnd.COMPLETED if result.succeeded else end
        decision = after_run(end, attempt, self._retry.overridden(row.settings.get("retry")), result.error)
        bound.info(
            "execution finished",
            status=end.value,
            duration=round(result.duration, 4),
            retry_in=round(decision.delay, 3) if decision.delay is not None else None,
        )
        await self._output.close(out)  # before the result: after it, the fenced append is refused
        self._results.put(Finished(eid, attempt, end, decision, result.to_json(), result.error, action=ref))

    async def _run_action(self, row: ClaimedRun, on_output: Callable[[str, bytes], None]) -> ActionResult:
        metadata = row.settings
        timeout = float(metadata.get("timeout") or self.cfg.execution_timeout)
        if row.runner_type == "subprocess":
            return await run_subprocess(
                metadata,
                row.parameters,
                timeout=timeout,
                kill_grace=self.cfg.kill_grace,
                output_limit=self.cfg.output_limit,
                on_output=on_output,
            )
        definition = self._actions.get(row.action_ref)
        if definition is None:
            error = f"action {row.action_ref} has no code on worker {self.name}"
            return ActionResult(succeeded=False, exit_code=None, duration=0.0, error=error)
        if (metadata.get("isolation") or self.cfg.isolation) == "process":
            return await run_isolated(
                definition,
                row.parameters,
                timeout=timeout,
                kill_grace=self.cfg.kill_grace,
                lease=self._lease,
                output_limit=self.cfg.output_limit,
            )
        return await run_python(
            definition, row.parameters, timeout=timeout, executor=self._threads, output_limit=self.cfg.output_limit
        )


def _cancelled(eid: int, attempt: int) -> Finished:
    decision = cancelled()
    result = {"succeeded": False, "error": decision.error}
    return Finished(eid, attempt, AttemptEnd.CANCELLED, decision, result, decision.error)


async def _ring_on(stop: asyncio.Event, bell: Doorbell) -> None:
    await stop.wait()
    bell.ring()
