"""executor.exclusive_duties: each recovery duty on one replica at a time (and the
retention of finished executions always: executor/retention.py).

The locks are session advisory locks on one connection of the executor's own, outside
its pool. A transaction lock taken on a pool connection (as before) held that connection
for the whole duty while the duty took a second one from the same pool: when as many
duties ticked together as the pool had connections, each held one and waited for
another, and every duty and the scheduling round stalled for the pool timeout. Here a
duty holding its lock holds no pool connection for it.

A replica that dies mid-duty drops its locks with its session; so does one whose lock
connection breaks (the next tick reconnects). Exclusivity only saves duplicate scans:
every duty is safe on several replicas at once, so a lock lost mid-duty is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from conveyor.store.db import SESSION_ENDED, Row, connect
from conveyor.store.queries import Q


class DutyLocks:
    def __init__(self, url: str, schema: str, application_name: str) -> None:
        self._url, self._schema, self._name = url, schema, application_name
        self._conn: psycopg.AsyncConnection[Row] | None = None
        self._connecting = asyncio.Lock()

    async def _connection(self) -> psycopg.AsyncConnection[Row]:
        async with self._connecting:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = await connect(self._url, self._schema, self._name, autocommit=True)
            return self._conn

    async def run(self, duty: Callable[[], Awaitable[Any]], *, name: str | None = None) -> bool:
        """Run ``duty`` unless another replica runs it now; return whether it ran here.
        The lock is named ``name``, by default the duty's ``__name__``. Raises
        psycopg.OperationalError when the lock cannot be asked for."""
        key = {"duty": name or duty.__name__}
        conn = await self._connection()
        got = await (await conn.execute(Q["try_duty_lock"], key)).fetchone()
        if got is None or not got["locked"]:
            return False
        try:
            await duty()
        finally:
            # A broken connection took the lock with it; a new one never had it.
            if conn is self._conn and not conn.broken:
                with contextlib.suppress(*SESSION_ENDED):
                    await conn.execute(Q["duty_unlock"], key)
        return True

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
