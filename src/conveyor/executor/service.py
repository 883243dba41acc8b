"""The executor process: scheduling rounds woken by the transport, plus the
stale-claim sweep. Safe to run as any number of replicas."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from conveyor.config import Settings
from conveyor.executor import gauges
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.executor.duties import DutyLocks
from conveyor.executor.events import Enforcer
from conveyor.executor.liveness import ExecutorLiveness, new_liveness_key
from conveyor.executor.recovery import Recovery
from conveyor.executor.retention import DUTY as RETENTION_DUTY
from conveyor.executor.retention import Retention
from conveyor.executor.scheduler import Scheduler
from conveyor.executor.schedules import BUFFERED_POLL, Firer
from conveyor.executor.woken import DutyHealth, WokenDuty, run_woken, sleep_or_stop
from conveyor.executor.workflows import Advancer
from conveyor.store.db import SESSION_ENDED, Pool, log_operational
from conveyor.store.queries import Q
from conveyor.transport import messages as m
from conveyor.transport.base import Topic, Transport

log = structlog.get_logger(__name__)


def make_executor_id(key: str) -> str:
    """``key``: the executor's liveness key (executor/liveness.py), which ends the id."""
    return f"{socket.gethostname()}:{os.getpid()}:{key}"


class ExecutorService:
    def __init__(self, settings: Settings, direct_url: str, pool: Pool, transport: Transport) -> None:
        """``direct_url``: for the duty-lock session (session advisory locks: never through a
        transaction pooler, database.direct_url)."""
        self.settings = settings
        key = new_liveness_key()
        self.executor_id = make_executor_id(key)
        self._liveness = ExecutorLiveness(direct_url, settings.database.schema_name, key, settings.executor_liveness)
        self._pool = pool
        cfg = settings.executor
        self._scheduler = Scheduler(
            pool,
            executor_id=self.executor_id,
            batch_size=cfg.batch_size,
            no_worker_grace=cfg.no_worker_grace,
            unplaceable_check_interval=cfg.poll_interval,
            workflow_max_depth=settings.workflow.max_depth,
        )
        self._recovery = Recovery(pool, settings)
        self._retention = Retention(pool, settings.retention)
        self._advancer = Advancer(
            pool,
            batch_size=settings.workflow.batch_size,
            bounds=settings.workflow,
            documents=settings.documents.limits(),
        )
        self._dead_letters = DeadLetterHandler(pool, transport, settings, self.executor_id)
        if settings.dead_letter.enabled:
            transport.handle_dead_letters(self._dead_letters)
        self._transport = transport
        self._transport_kind = transport.kind
        # Connected at the first duty that takes a lock: retention always does (retention.py),
        # the other shared duties only with executor.exclusive_duties.
        self._duty_locks = DutyLocks(
            direct_url,
            settings.database.schema_name,
            "conveyor-executor-duties",
            frozen_after=settings.executor_liveness.frozen_after,
        )
        # Subscribed before the transport starts listening: new requests and freed
        # capacity both mean a round may now place something.
        self._health = DutyHealth(settings.executor.duty_failures_before_unready)
        self._bell = transport.subscribe(Topic.REQUESTED)
        transport.subscribe(Topic.CAPACITY, bell=self._bell)
        self._workflow_bell = transport.subscribe(Topic.WORKFLOW)
        self._enforcer = Enforcer(pool, batch_size=settings.events.batch_size, documents=settings.documents.limits())
        self._event_bell = transport.subscribe(Topic.EVENT)
        # Schedules: a change may bring the next slot sooner.
        self._firer = Firer(pool, batch_size=settings.schedules.batch_size)
        self._schedule_bell = transport.subscribe(Topic.SCHEDULE)

    async def run(self, stop: asyncio.Event) -> None:
        log.info("executor started", executor=self.executor_id)
        self._log_monitors()
        await self._liveness.open()  # before the first claim: a claim without it is handed back at once
        try:
            await self._run(stop)
        finally:
            await self._liveness.close()
            await self._duty_locks.close()
        log.info("executor stopped", executor=self.executor_id)

    def _log_monitors(self) -> None:
        """The seeds' startup lines: what the troubleshooting steps grep for."""
        settings = self.settings
        sweep, staleness = settings.recovery.sweep_interval, settings.worker.staleness
        log.info("Starting worker heartbeat monitor...")
        # Each worker records its own threshold (stale_after); this is the one of this config.
        log.info(
            f"Worker heartbeat monitor started (check interval: {sweep:g}s, staleness threshold: {staleness:g}s)",
            check_interval=sweep,
            staleness_threshold=staleness,
        )
        cfg = settings.executor
        log.info(
            f"Execution timeout monitor started (check interval: {cfg.timeout_check_interval:g}s, "
            f"scheduled timeout: {cfg.scheduled_timeout:g}s)"
        )
        dl = settings.dead_letter
        if not dl.enabled:
            log.warning("Dead letter handler disabled (dead_letter.enabled: false): dead letters are not consumed")
        elif self._transport_kind == "rabbitmq":
            dlq = m.Names(settings.message_queue.prefix, settings.dead_letter_exchange).dlq
            log.info(
                f"Dead letter handler enabled (exchange: {settings.dead_letter_exchange}, queue: {dlq})",
                transport="rabbitmq",
            )
        else:
            ttl = settings.message_queue.rabbitmq.worker_queue_ttl_ms / 1000
            log.info(
                f"Dead letter handler enabled (dispatches older than {ttl:g}s expire; "
                f"checked every {dl.check_interval:g}s)",
                transport="postgres",
            )

    async def _run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._liveness.run(stop), name="executor-liveness")
            for duty in self._woken_duties():
                tg.create_task(run_woken(duty, stop, self._health), name=f"executor-{duty.name}")
            # Every replica, no duty lock: a frozen replica holding that lock must not hold this up.
            tg.create_task(
                self._every(
                    stop, self.settings.executor_liveness.check_interval, self._release_gone_claims, shared=False
                ),
                name="executor-gone-claims",
            )
            tg.create_task(
                self._every(stop, self.settings.workflow.poll_interval, self._workflow_timeouts),
                name="executor-workflow-timeouts",
            )
            tg.create_task(self._every(stop, self.settings.recovery.sweep_interval, self._sweep), name="executor-sweep")
            # Every replica asks (shared=False): one read-only statement, cheaper than the
            # duty lock's round trips; the sweep it may start takes its own lock.
            tg.create_task(
                self._every(stop, self.settings.recovery.watch_interval, self._watch, shared=False),
                name="executor-watch",
            )
            cfg = self.settings.executor
            tg.create_task(
                self._every(stop, cfg.timeout_check_interval, self._recovery.check_scheduled_timeouts),
                name="executor-scheduled-timeouts",
            )
            tg.create_task(
                self._every(stop, min(cfg.claim_timeout / 2, cfg.timeout_check_interval), self._reclaim),
                name="executor-reclaim",
            )
            dl = self.settings.dead_letter
            if dl.enabled and self._transport_kind == "postgres":
                tg.create_task(
                    self._every(stop, dl.check_interval, self._dead_letters.expire_dispatches),
                    name="executor-expire-dispatches",
                )
            tg.create_task(self._every(stop, dl.check_interval, self._dead_letter_upkeep), name="executor-dead-letters")
            tg.create_task(
                self._every(stop, cfg.metrics_interval, self._refresh_gauges, shared=False), name="executor-gauges"
            )
            tg.create_task(
                self._every(stop, cfg.admission_repair_interval, self._repair_admission),
                name="executor-admission-repair",
            )
            # Often enough that a key outlives its retention by a small fraction of it.
            tg.create_task(
                self._every(stop, min(60.0, cfg.idempotency_key_retention / 10), self._purge_keys),
                name="executor-idempotency-keys",
            )
            tg.create_task(
                self._every(stop, cfg.inquiry_check_interval, self._expire_inquiries), name="executor-inquiries"
            )
            # Retention of finished executions: one replica at a time whatever
            # exclusive_duties says, so _purge_history takes the duty lock itself.
            tg.create_task(
                self._every(stop, self.settings.retention.interval, self._purge_history, shared=False),
                name="executor-retention",
            )
            reconcile_every = self.settings.message_queue.reconcile_after / 2
            tg.create_task(self._every(stop, reconcile_every, self._transport.reconcile), name="executor-reconcile")

    def _woken_duties(self) -> list[WokenDuty]:
        """The duties woken by the transport, as data: executor/woken.py runs each."""
        s = self.settings
        return [
            WokenDuty(
                name="scheduling",
                what="scheduling round",
                bell=self._bell,
                poll=s.executor.poll_interval,
                run_pass=self._schedule_pass,
                bug_is_fatal=True,
            ),
            WokenDuty(
                name="workflows",
                what="workflow pass",
                bell=self._workflow_bell,
                poll=s.workflow.poll_interval,
                run_pass=self._workflow_pass,
            ),
            WokenDuty(
                name="rules",
                what="rules pass",
                bell=self._event_bell,
                poll=s.events.poll_interval,
                run_pass=self._rules_pass,
            ),
            WokenDuty(
                name="schedules",
                what="schedule pass",
                bell=self._schedule_bell,
                poll=s.schedules.poll_interval,
                run_pass=self._slots_pass,
            ),
        ]

    async def _schedule_pass(self) -> float | None:
        """A scheduling round (executor/scheduler.py)."""
        result = await self._scheduler.run_round()
        if result.more and result.dispatched + result.failed + result.asked == result.claimed:
            return None  # a full batch placed whole: there may be more waiting
        # Idle: sleep until the next wake-up, the poll, or the earliest delayed request
        # (not_before), whichever comes first -- so it is placed at its time.
        # (Already rung, by a wake-up during the round: no need to ask how long.)
        return 0.0 if self._bell.rung else await self._until_next_delayed(self.settings.executor.poll_interval)

    async def _until_next_delayed(self, poll: float) -> float:
        try:
            async with self._pool.connection() as conn:
                row = await (await conn.execute(Q["next_not_before"])).fetchone()
        except SESSION_ENDED:
            return poll  # the next round reports the outage
        wait = row["wait"] if row else None
        # A floor: the event loop's timer may fire a little early; then the next round
        # finds nothing and this comes round again with the small remainder.
        return poll if wait is None else max(0.001, min(poll, float(wait)))

    async def _workflow_pass(self) -> float | None:
        """Advance workflows with pending events (executor/workflows.py): woken by the
        'workflow' topic, and polled -- the reconciler for what a dead replica left. (Each
        workflow's own errors fail that workflow, not the pass.)"""
        result = await self._advancer.run_pass()
        cfg = self.settings.workflow
        if result.advanced + result.failed + result.skipped >= cfg.batch_size:
            return None  # a full batch: there may be more waiting
        return cfg.poll_interval

    async def _rules_pass(self) -> float | None:
        """Evaluate pending events' rules (executor/events.py): woken by the 'event'
        topic, and polled -- the reconciler for what a dead replica left pending. (A
        failed pass leaves its events pending.)"""
        result = await self._enforcer.run_pass()
        cfg = self.settings.events
        return None if result.events >= cfg.batch_size else cfg.poll_interval

    async def _slots_pass(self) -> float | None:
        """Fire due schedule slots (executor/schedules.py), then sleep exactly until the
        earliest next fire time (database clock), capped by schedules.poll_interval."""
        poll = self.settings.schedules.poll_interval
        result = await self._firer.run_pass()
        await self._firer.release_buffered()
        wait = 0.0 if result.full else await self._firer.until_next(poll)
        if self._firer.waiting:  # buffer_one: look again soon for the run that blocks it
            wait = min(wait, BUFFERED_POLL)
        return wait if wait > 0 else None

    async def _workflow_timeouts(self) -> int:
        """Task and workflow deadlines passed become 'timeout' events."""
        return await self._advancer.timeouts()

    async def _sweep(self) -> Any:
        return self._reschedule(await self._recovery.sweep())

    async def _watch(self) -> Any:
        return self._reschedule(await self._recovery.watch())

    def _reschedule(self, result: dict[str, int]) -> dict[str, int]:
        if result.get("requeued") or result.get("handed_back"):
            self._bell.ring()  # reschedule now, not at the next poll
        return result

    async def _dead_letter_upkeep(self) -> int:
        """Retention (dead_letter.ttl_ms) and the dead-letter gauges."""
        purged = await self._dead_letters.purge_expired()
        await self._dead_letters.refresh_gauges()
        return purged

    async def _purge_keys(self) -> int:
        """Retention of idempotency keys (executor.idempotency_key_retention)."""
        retention = self.settings.executor.idempotency_key_retention
        async with self._pool.connection() as conn:
            cursor = await conn.execute(Q["purge_idempotency_keys"], {"retention": retention})
            return int(cursor.rowcount)

    async def _purge_history(self) -> bool:
        """Finished executions past their retention.<status> age (executor/retention.py),
        on one replica at a time; returns whether it ran here."""
        if not self._retention.enabled:
            return False
        return await self._duty_locks.run(self._retention.purge, name=RETENTION_DUTY)

    async def _refresh_gauges(self) -> None:
        """The execution, worker and backlog gauges (executor/gauges.py)."""
        await gauges.refresh(self._pool)

    async def _expire_inquiries(self) -> int:
        """Inquiries past their ttl: timeout, or answered with their default (expire_inquiries)."""
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["expire_inquiries"])).fetchall()
        for row in rows:
            log.info(
                "inquiry expired", inquiry_id=row["inquiry"], execution_id=row["execution"], outcome=row["outcome"]
            )
        return len(rows)

    async def _release_gone_claims(self) -> int:
        released = await self._scheduler.release_gone_claims()
        if released:
            self._bell.ring()  # place them now, not at the next poll
        return released

    async def _reclaim(self) -> int:
        return await self._scheduler.reclaim_stale(self.settings.executor.claim_timeout)

    async def _repair_admission(self) -> int:
        admitted = await self._scheduler.repair_admission()
        if admitted:
            self._bell.ring()
        return admitted

    async def _every(
        self, stop: asyncio.Event, interval: float, duty: Callable[[], Awaitable[Any]], *, shared: bool = True
    ) -> None:
        """Run ``duty`` every ``interval`` until stopped; a database outage is logged and
        retried at the next tick (these duties are idempotent). ``shared`` duties are the
        ones executor.exclusive_duties runs on one replica at a time (not the gauges: each
        replica serves its own; nor retention, which is exclusive by itself)."""
        exclusive = shared and self.settings.executor.exclusive_duties
        while not await sleep_or_stop(stop, interval):
            try:
                if exclusive:
                    await self._exclusively(duty)
                else:
                    await duty()
            except SESSION_ENDED as exc:
                log_operational(log, "recovery duty", exc, duty=duty.__name__)
                continue
            except Exception:  # a bug in one duty must not stop the others, nor crash-loop the executor
                self._health.failed(duty.__name__)
                continue
            self._health.succeeded(duty.__name__)

    @property
    def failing_duties(self) -> list[str]:
        """Duties that failed executor.duty_failures_before_unready times in a row."""
        return self._health.failing

    @property
    def ready(self) -> bool:
        return not self.failing_duties

    async def _exclusively(self, duty: Callable[[], Awaitable[Any]]) -> None:
        """Run ``duty`` unless another replica is running it now (executor/duties.py)."""
        await self._duty_locks.run(duty)
