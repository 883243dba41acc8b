"""The dead-letter handler: every dead-lettered message is recorded, then resolved with
guarded transitions -- the same code for both transports.

- An ``execution.scheduled`` dispatch whose execution is still exactly there (scheduled,
  same attempt, same worker, same dispatch time) is moved to another worker up to
  ``executor.scheduled_timeout_reschedules`` times, then failed with the seeds' text;
  either way the execution leaves the worker, releasing its slot, and waiters and
  executors are told. An execution that moved on is left alone: the letter is stale.
- A wake-up message (requested, capacity, completed) points at rows the regular loops
  handle anyway: recorded as stale, and executors are rung.
- A body that is not a Conveyor message is recorded as invalid.

The record and the resolution commit together; a redelivered dead letter finds its
record (same dedupe key) and is not resolved twice. On the PostgreSQL transport the
executor itself turns dispatches older than the worker queue TTL into dead letters.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import structlog
from psycopg.types.json import Jsonb

from conveyor.config import Settings
from conveyor.domain.dead_letters import Resolution
from conveyor.domain.ids import MAX_ID
from conveyor.domain.outcome import AttemptEnd, after_missed_dispatch
from conveyor.domain.status import ExecutionStatus
from conveyor.ops.metrics import DEAD_LETTER_HANDLER_SECONDS, DEAD_LETTER_RECORDS, DEAD_LETTERS, DLQ_DEPTH
from conveyor.store import transitions
from conveyor.store.db import SESSION_ENDED, AsyncConn, Pool, Row
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.transport import messages as m
from conveyor.transport.base import Transport

log = structlog.get_logger(__name__)

EXPIRED_ERROR = "Message expired in worker queue (worker unavailable)"


def dispatch_error(reason: str) -> str:
    return EXPIRED_ERROR if reason == "expired" else f"Dispatch dead-lettered from worker queue ({reason})"


class DeadLetterHandler:
    def __init__(self, pool: Pool, transport: Transport, settings: Settings, executor_id: str) -> None:
        self._pool = pool
        self._transport = transport
        self._settings = settings
        self._names = m.Names(settings.message_queue.prefix, settings.dead_letter_exchange)
        self._reschedules = settings.executor.scheduled_timeout_reschedules
        self._by = executor_id
        self._failures: dict[str, int] = {}  # expired dispatches whose handling failed (postgres transport)

    async def handle(self, dead_letter: m.DeadLetter) -> str:
        started = time.monotonic()
        row = self._params(dead_letter)
        if row["execution"] is not None:  # the seeds' line; "dead letter handled" says how it ended
            log.warning(
                f"Received dead letter for execution {row['execution']}",
                execution_id=row["execution"],
                reason=dead_letter.reason,
                queue=dead_letter.queue,
            )
        async with self._pool.connection() as conn, conn.transaction():
            record = await (await conn.execute(Q["record_dead_letter"], row)).fetchone()
            assert record is not None
            if record["resolution"] is not None:
                return str(record["resolution"])  # a redelivery of one already resolved
            resolution, detail = await self._resolve(conn, dead_letter)
            params = {"id": record["id"], "resolution": resolution, "by": self._by, "detail": m.pg_text(detail)}
            await conn.execute(Q["resolve_dead_letter"], params)
        DEAD_LETTER_HANDLER_SECONDS.observe(time.monotonic() - started)
        DEAD_LETTERS.labels(dead_letter.reason, resolution).inc()
        log.warning(
            "dead letter handled",
            reason=dead_letter.reason,
            queue=dead_letter.queue,
            message_id=dead_letter.message_id,
            resolution=resolution,
            detail=detail,
            execution_id=row["execution"],
            attempt=row["attempt"],
            worker_id=row["worker"],
        )
        return resolution

    async def record_unresolved(self, dead_letter: m.DeadLetter) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(Q["record_dead_letter"], self._params(dead_letter))
        DEAD_LETTERS.labels(dead_letter.reason, Resolution.PENDING).inc()

    def _params(self, dl: m.DeadLetter) -> dict[str, Any]:
        payload = dl.payload()
        execution = attempt = worker = None
        message_type = payload.get("message_type") if isinstance(payload.get("message_type"), str) else None
        inner = payload.get("payload")
        if isinstance(inner, dict):
            ids = inner.get("execution_ids")
            execution = inner.get("execution_id") or (ids[0] if isinstance(ids, list) and len(ids) == 1 else None)
            attempt, worker = inner.get("attempt"), inner.get("worker_id")
        as_int = [
            v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < MAX_ID else None
            for v in (execution, attempt, worker)
        ]
        return {
            "dedupe_key": dl.dedupe_key,
            "message_id": dl.message_id,
            "transport": dl.transport,
            "queue": dl.queue,
            "exchange": dl.exchange,
            "routing_key": dl.routing_key,
            "reason": dl.reason,
            "message_type": message_type,
            "payload": Jsonb(payload),
            "headers": Jsonb(dl.headers),
            "execution": as_int[0],
            "attempt": as_int[1] if as_int[1] is None or as_int[1] < 2**31 else None,
            "worker": as_int[2],
            "error": dl.error,
        }

    async def _resolve(self, conn: AsyncConn, dl: m.DeadLetter) -> tuple[Resolution, str]:
        try:
            envelope = dl.envelope()
            if envelope.message_type != m.SCHEDULED:
                detail = f"a {envelope.message_type} wake-up; the rows it points at are handled by polling"
                return Resolution.STALE, detail
            dispatch = m.Dispatch.of(envelope)
        except m.InvalidMessageError as exc:
            return Resolution.INVALID, str(exc)
        if dispatch.attempt >= 2**31 or dispatch.execution_id >= MAX_ID or dispatch.worker_id >= MAX_ID:
            return Resolution.INVALID, "execution.scheduled with out-of-range numbers"
        row = await (
            await conn.execute(
                Q["lock_dispatch"],
                {
                    "execution": dispatch.execution_id,
                    "attempt": dispatch.attempt,
                    "worker": dispatch.worker_id,
                    "scheduled": dispatch.scheduled,
                },
            )
        ).fetchone()
        if row is None:
            return Resolution.STALE, "the execution moved on since this dispatch; left alone"
        decision = after_missed_dispatch(row["missed"], self._reschedules, dispatch_error(dl.reason))
        decisions = Decisions()
        decisions.add(row, decision)
        params = decisions.params(
            AttemptEnd.EXPIRED,
            by="dead_letter_handler",
            from_statuses=(ExecutionStatus.SCHEDULED,),
            worker=dispatch.worker_id,
        )
        moved = await transitions.resolve_attempts(conn, params)
        if not moved:
            return Resolution.STALE, "the execution moved on while being resolved"
        if decision.again:
            detail = f"execution {dispatch.execution_id} handed back to be placed on another worker"
            return Resolution.RESCHEDULED, detail
        return Resolution.FAILED, f"execution {dispatch.execution_id} failed: {decision.error}"

    # -- executor duties -------------------------------------------------------------

    async def expire_dispatches(self) -> int:
        """PostgreSQL transport: dispatches older than the worker queue TTL become dead
        letters exactly as RabbitMQ's TTL would make them."""
        ttl = self._settings.message_queue.rabbitmq.worker_queue_ttl_ms / 1000
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["expired_dispatches"], {"ttl": ttl})).fetchall()
        handled = 0
        for row in rows:
            dead_letter = self._expired(row)
            if self._failures.get(dead_letter.dedupe_key, 0) >= self._settings.dead_letter.max_deliveries:
                continue  # recorded as poison; the schedule-to-start monitor still bounds the execution
            try:
                await self.handle(dead_letter)
                handled += 1
            except SESSION_ENDED:
                raise
            except Exception as exc:  # the same bound as a broker's poison message
                failures = self._failures[dead_letter.dedupe_key] = self._failures.get(dead_letter.dedupe_key, 0) + 1
                log.exception(
                    "expired dispatch could not be handled",
                    execution_id=row["id"],
                    attempt=row["attempt"],
                    worker_id=row["worker"],
                    failures=failures,
                )
                if failures >= self._settings.dead_letter.max_deliveries:
                    await self.record_unresolved(dead_letter.as_poison(f"{type(exc).__name__}: {exc}"))
        return handled

    def _expired(self, row: Row) -> m.DeadLetter:
        scheduled: datetime = row["scheduled"]
        payload = {
            "execution_id": row["id"],
            "attempt": row["attempt"],
            "worker_id": row["worker"],
            "scheduled": scheduled.isoformat(),
        }
        message_id = f"pg:{row['id']}:{row['attempt']}:{scheduled.timestamp():.6f}"
        return m.DeadLetter(
            dedupe_key=message_id,
            message_id=message_id,
            transport="postgres",
            queue=self._names.worker_queue(row["worker"]),
            routing_key=m.Names.worker_key(row["worker"]),
            reason="expired",
            body=m.encode(message_id, m.SCHEDULED, payload, scheduled),
        )

    async def purge_expired(self) -> int:
        ttl = self._settings.dead_letter.ttl_ms / 1000
        async with self._pool.connection() as conn:
            cursor = await conn.execute(Q["purge_expired_dead_letters"], {"ttl": ttl})
            return int(cursor.rowcount)

    async def refresh_gauges(self) -> None:
        async with self._pool.connection() as conn:
            stats = await (await conn.execute(Q["dead_letter_stats"])).fetchone()
        assert stats is not None
        broker = await self._transport.dlq_depth()
        DLQ_DEPTH.set(stats["pending"] + (broker or 0))
        DEAD_LETTER_RECORDS.set(stats["total"])
