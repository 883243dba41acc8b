"""Retention of finished executions (issue #14): every ``retention.interval`` one executor
replica deletes, per finished status, the executions older than that status's
``retention.<status>`` age, through ``purge_executions`` (migration 0024) -- the same SQL
function as ``conveyor executions purge``.

One replica at a time: a session advisory lock (``try_duty_lock``, named
``purge_history``) on the pool connection the run uses, released at its end or with the
session. Each batch (``retention.batch_size`` top-level executions and their trees) is
its own short transaction, so a run never holds many row locks nor a long snapshot; a run
stops after ``retention.max_batches`` and the rest waits for the next one, so a first run
on a large backlog does not take the database for itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from conveyor.config import RetentionSettings
from conveyor.metrics import EXECUTIONS_PURGED
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)
DUTY = {"duty": "purge_history"}


class Retention:
    def __init__(self, pool: AsyncConnectionPool[Any], settings: RetentionSettings) -> None:
        self._pool = pool
        self._settings = settings

    async def purge(self) -> int:
        """One run: returns how many executions it deleted (0 when another replica runs)."""
        policy = self._settings.policy()
        if not policy:
            return 0
        async with self._pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                got = await (await conn.execute(Q["try_duty_lock"], DUTY)).fetchone()
                if got is None or not got["locked"]:
                    return 0
                try:
                    return await self._run(conn, policy)
                finally:
                    if not conn.broken:
                        with contextlib.suppress(psycopg.OperationalError):
                            await conn.execute(Q["duty_unlock"], DUTY)
            finally:
                if not conn.broken:
                    await conn.set_autocommit(False)

    async def _run(self, conn: psycopg.AsyncConnection[Any], policy: dict[str, float]) -> int:
        batch, budget, total = self._settings.batch_size, self._settings.max_batches, 0
        for status, seconds in policy.items():
            while budget > 0:
                budget -= 1
                params = {"older_than": seconds, "statuses": [status], "batch": batch}
                row = await (await conn.execute(Q["purge_executions"], params)).fetchone()
                purged = int(row["purged"]) if row else 0
                if purged:
                    EXECUTIONS_PURGED.labels(status).inc(purged)
                    total += purged
                if purged == 0:
                    break
        if total:
            log.info("finished executions purged", purged=total)
        return total
