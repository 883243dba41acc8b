"""Recording results: batched, fenced writes of what the worker's executions produced.

A result waits in memory until it is written; the row stays ``running`` meanwhile,
which recovery (not this writer) arbitrates if the worker is gone too long.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor import failpoints
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.store.queries import Q
from conveyor.worker.instrument import observe_result

log = structlog.get_logger(__name__)

# Completions are written in batches of at most this many rows per statement.
_BATCH = 500


@dataclass(frozen=True, slots=True)
class Finished:
    execution_id: int
    attempt: int
    end: AttemptEnd  # how this attempt ended: completed, failed, timeout, cancelled
    decision: Decision  # what the execution does next (domain.outcome)
    result: dict[str, Any]
    error: str | None
    action: str | None = None  # the action's ref, for metrics


class ResultWriter:
    def __init__(self, pool: AsyncConnectionPool[Any], worker: str) -> None:
        self._pool = pool
        self._worker = worker
        self.worker_id: int | None = None
        self._queue: asyncio.Queue[Finished] = asyncio.Queue()
        # Executions whose result is queued or being written (their rows are still running).
        self.pending: set[int] = set()

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
            log.error("results not written before exit; recovery will re-run those executions",
                      pending=self._queue.qsize(), worker=self._worker)  # fmt: skip
            return False
        return True

    async def run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < _BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._write(batch)
            for f in batch:
                self.pending.discard(f.execution_id)
                self._queue.task_done()

    async def _write(self, batch: list[Finished]) -> None:
        delay = 0.1
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
        while True:
            try:
                # Pipelined: the update and its wake-ups go in one round trip with the
                # commit. The wake-up names every id of the batch; waiters re-read rows.
                async with self._pool.connection() as conn, conn.pipeline():
                    async with conn.transaction():
                        cursor = await conn.execute(Q["finish"], {**params, "worker": self.worker_id})
                        if failpoints.armed("worker.before_result_commit"):
                            await cursor.fetchall()  # the update (and its triggers) done, uncommitted
                        failpoints.reach("worker.before_result_commit")
                    written = {r["id"] for r in await cursor.fetchall()}
                break
            except psycopg.OperationalError as exc:
                log.warning("cannot record results; retrying", error=str(exc).strip(), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        for f in batch:
            if f.execution_id not in written:
                log.warning("late result refused: the execution moved on without this attempt",
                            execution_id=f.execution_id, attempt=f.attempt, worker=self._worker)  # fmt: skip
