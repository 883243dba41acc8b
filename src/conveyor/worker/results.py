"""Recording results: batched, fenced writes of what the worker's executions produced.

A result waits in memory until it is written; the row stays ``running`` meanwhile,
which recovery (not this writer) arbitrates if the worker is gone too long.

The transaction that records results also claims the next executions for the slots
they freed (``Refill``): finishing one execution and starting the next cost one round
trip and one WAL flush, not two -- at a small concurrency that flush is most of an
execution's cost. The claim commits durably before anything it claimed runs, as the
claim loop's does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import structlog
from psycopg.types.json import Jsonb

from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus
from conveyor.domain.storable import ERROR_LIMIT, clean_text
from conveyor.ops import failpoints
from conveyor.store import transitions
from conveyor.store.db import RECONNECT_INTERVAL, Pool
from conveyor.store.queries import Q
from conveyor.store.rows import ClaimedRun
from conveyor.worker.instrument import observe_result

log = structlog.get_logger(__name__)

# Completions are written in batches of at most this many rows per statement, with at
# most this many batches in flight.
_BATCH = 500
_WRITES = 2
# What a write raises because of the data it carries, not because the database is away:
# retried as it is, it would fail for ever. (The runners make results storable first;
# this is the net under them.)
_REFUSED = (
    psycopg.DataError,
    psycopg.errors.ProgramLimitExceeded,
    psycopg.InternalError,
    UnicodeError,
    ValueError,
    TypeError,
    RecursionError,
)


@dataclass(frozen=True, slots=True)
class Finished:
    execution_id: int
    attempt: int
    end: AttemptEnd  # how this attempt ended: completed, failed, timeout, cancelled
    decision: Decision  # what the execution does next (domain.outcome)
    result: dict[str, Any]
    error: str | None
    action: str | None = None  # the action's ref, for metrics

    def refused(self, reason: str) -> Finished:
        """This attempt ended failed because its result could not be stored, and why."""
        error = clean_text(f"the result cannot be stored: {reason}", ERROR_LIMIT)
        result = {"succeeded": False, "error": error, "duration": self.result.get("duration")}
        decision = Decision(ExecutionStatus.FAILED, None, error)  # never retried: it would be refused again
        return Finished(self.execution_id, self.attempt, AttemptEnd.FAILED, decision, result, error, self.action)


class Refill(Protocol):
    """The worker's side of claiming in the result transaction."""

    def reserve(self) -> int:
        """Slots to claim for now (0: none); reserved until ``claimed`` is called."""

    def claimed(self, rows: list[ClaimedRun], reserved: int, *, in_doubt: bool = False) -> None:
        """Start what was claimed and free the reservation; ``in_doubt``: the commit went
        unanswered, so rows may have been claimed all the same."""


class ResultWriter:
    def __init__(
        self,
        pool: Pool,
        worker: str,
        refill: Refill | None = None,
        retry_max: float = RECONNECT_INTERVAL,
    ) -> None:
        self._pool = pool
        # The longest wait between two tries of a write (database.reconnect_interval): a
        # result finished in an outage is written within about this long of the server's
        # return. Each try already waits up to database.pool_timeout inside the pool while
        # it has no connection, so a short wait here does not spin.
        self._retry_max = retry_max
        self._worker = worker
        self._refill = refill
        self.worker_id: int | None = None
        self._queue: asyncio.Queue[Finished] = asyncio.Queue()
        # Executions whose result is queued or being written (their rows are still running).
        self.pending: set[int] = set()

    @property
    def queued(self) -> int:
        """Results waiting for the next write (not yet in one)."""
        return self._queue.qsize()

    def put(self, finished: Finished) -> None:
        self.pending.add(finished.execution_id)
        self._queue.put_nowait(finished)
        observe_result(finished.action, finished.end, finished.result)

    async def flushed(self, within: float) -> bool:
        """Wait until everything queued is written; False if that took longer than ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                await self._queue.join()
        except TimeoutError:
            log.error(
                "results not written before exit; recovery will re-run those executions",
                pending=self._queue.qsize(),
                worker=self._worker,
            )
            return False
        return True

    async def run(self) -> None:
        # Up to _WRITES batches in flight, each its own transaction on its own connection:
        # a result that comes while one commits goes in the next at once, and PostgreSQL
        # flushes the WAL of commits that wait together once (group commit). With a few
        # slots that finish apart, one at a time would pay a flush per result.
        writing = asyncio.Semaphore(_WRITES)
        async with asyncio.TaskGroup() as tasks:
            while True:
                first = await self._queue.get()
                await writing.acquire()  # meanwhile more results join this batch
                batch = [first]
                while len(batch) < _BATCH and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                tasks.create_task(self._write_batch(batch, writing))

    async def _write_batch(self, batch: list[Finished], writing: asyncio.Semaphore) -> None:
        try:
            await self._write_each(batch)
        finally:
            writing.release()
        for f in batch:
            self.pending.discard(f.execution_id)
            self._queue.task_done()

    async def _write_each(self, batch: list[Finished]) -> None:
        """Write the batch; when its data is refused, each row on its own, so that a result
        that cannot be stored neither holds back nor takes down the others. That one ends
        failed, with the reason (not retried: the same result would be refused again)."""
        try:
            await self._write(batch, claim=True)
            return
        except _REFUSED as exc:
            if len(batch) > 1:
                for f in batch:
                    await self._write_each([f])
                return
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        f = batch[0]
        log.error(
            "result cannot be stored; the execution fails",
            execution_id=f.execution_id,
            attempt=f.attempt,
            worker=self._worker,
            error=clean_text(reason, ERROR_LIMIT),
        )
        try:
            await self._write([f.refused(reason)])
        except _REFUSED as exc:  # not even a few words: leave the row to recovery, keep the worker
            log.error(
                "cannot record the execution failed either",
                execution_id=f.execution_id,
                error=clean_text(str(exc), ERROR_LIMIT),
            )

    async def _write(self, batch: list[Finished], claim: bool = False) -> None:
        delay = min(0.1, self._retry_max)
        ids = [f.execution_id for f in batch]
        params = {
            "ids": ids,
            "attempts": [f.attempt for f in batch],
            "statuses": [f.decision.status.value for f in batch],
            "outcomes": [f.end.value for f in batch],
            "delays": [f.decision.delay for f in batch],
            "results": [Jsonb(f.result) for f in batch],
            "errors": [f.error for f in batch],
        }
        # The first try of a batch also claims for the free slots; a retry only records
        # (the claim loop takes over once the in-doubt claim is resolved).
        refill = self._refill if claim else None
        while True:
            limit = refill.reserve() if refill is not None else 0
            if not limit:
                refill = None  # nothing reserved: nothing to claim, now or on a retry
            try:
                # Pipelined: the update, its wake-ups and the claim go in one round trip
                # with the commit. The wake-up names every id of the batch; waiters re-read rows.
                async with self._pool.connection() as conn, conn.pipeline():
                    async with conn.transaction():
                        cursor = await conn.execute(Q["finish"], {**params, "worker": self.worker_id})
                        if failpoints.armed("worker.before_result_commit"):
                            await cursor.fetchall()  # the update (and its triggers) done, uncommitted
                        failpoints.reach("worker.before_result_commit")
                        if limit:
                            claiming = await transitions.claim_scheduled(conn, self.worker_id, limit)
                    written = {r["id"] for r in await cursor.fetchall()}
                    claimed: list[ClaimedRun] = list(await claiming.fetchall()) if limit else []
            except BaseException as exc:
                # Refused data, a lost connection, a cancellation: maybe mid-commit, so the
                # claim is in doubt whatever happened.
                if refill is not None:
                    refill.claimed([], limit, in_doubt=True)
                    refill = None
                ended = isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout)
                if not ended and (not isinstance(exc, psycopg.OperationalError) or isinstance(exc, _REFUSED)):
                    raise  # refused data (or a statement over a server limit), or cancelled
                log.warning("cannot record results; retrying", error=str(exc).strip(), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max)
                continue
            if refill is not None:
                refill.claimed(claimed, limit)
            break
        for f in batch:
            if f.execution_id not in written:
                log.warning(
                    "late result refused: the execution moved on without this attempt",
                    execution_id=f.execution_id,
                    attempt=f.attempt,
                    worker=self._worker,
                )
