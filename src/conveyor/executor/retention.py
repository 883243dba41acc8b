"""Retention of finished executions (issue #14): every ``retention.interval`` one executor
replica deletes, per finished status, the executions older than that status's
``retention.<status>`` age, through ``purge_executions`` (migration 0024) -- the same verb
(``verbs.executions.purge``) as ``conveyor executions purge``.

One replica at a time, whatever ``executor.exclusive_duties`` says: the service runs
``purge`` through its ``DutyLocks`` (executor/duties.py) under the lock named ``DUTY``, a
session advisory lock on the executor's own connection outside its pool. Concurrent
purges would be correct (``purge_executions`` takes its roots ``FOR UPDATE SKIP LOCKED``,
so two replicas delete disjoint trees) but each would take up to ``retention.max_batches``
batches: with every replica purging, a large backlog would load the database once per
replica. The lock used to be held on a pool connection, which the run then kept for all
its batches; now a run holds a pool connection only for each batch.

Each batch (``retention.batch_size`` top-level executions and their trees) is its own
short transaction, so a run never holds many row locks nor a long snapshot; a run stops
after ``retention.max_batches`` and the rest waits for the next one, so a first run on a
large backlog does not take the database for itself.
"""

from __future__ import annotations

import structlog

from conveyor.config import RetentionSettings
from conveyor.ops.metrics import EXECUTIONS_PURGED
from conveyor.store.db import Pool
from conveyor.verbs import executions
from conveyor.verbs.drive import run_async

log = structlog.get_logger(__name__)
# The duty lock's name: the one the replicas before DutyLocks took, so that old and new
# replicas still exclude each other during a rolling upgrade.
DUTY = "purge_history"


class Retention:
    def __init__(self, pool: Pool, settings: RetentionSettings) -> None:
        self._pool = pool
        self._settings = settings

    @property
    def enabled(self) -> bool:
        """Whether any finished status is purged at all (all ``off``: nothing to lock for)."""
        return bool(self._settings.policy())

    async def purge(self) -> int:
        """One run: returns how many executions it deleted. Not exclusive by itself: the
        caller holds the duty lock (``DUTY``)."""
        batch, budget, total = self._settings.batch_size, self._settings.max_batches, 0
        for status, seconds in self._settings.policy().items():
            while budget > 0:
                budget -= 1
                # A connection per batch: the pool's other users wait at most one batch.
                async with self._pool.connection() as conn:
                    purged = await run_async(conn, executions.purge(seconds, [status], batch))
                if purged == 0:
                    break
                EXECUTIONS_PURGED.labels(status).inc(purged)
                total += purged
        if total:
            log.info("finished executions purged", purged=total)
        return total
