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

A replica *frozen* while it holds a duty's lock (SIGSTOP, a paused VM: its kernel keeps the
session open) must not keep that duty from the others for as long as it is frozen (the
dead-worker sweep, say): the session carries ``idle_session_timeout`` =
executor_liveness.frozen_after and is spoken on every third of it, so the server ends it --
and its locks -- once the process has been silent that long.
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
    def __init__(self, url: str, schema: str, application_name: str, *, frozen_after: float = 3.0) -> None:
        self._url, self._schema, self._name = url, schema, application_name
        self._frozen_after = frozen_after
        self._conn: psycopg.AsyncConnection[Row] | None = None
        self._connecting = asyncio.Lock()
        self._pinger: asyncio.Task[None] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[Row]:
        async with self._connecting:
            if self._conn is None or self._conn.closed or self._conn.broken:
                conn = await connect(self._url, self._schema, self._name, autocommit=True)
                timeout = f"{max(1, round(self._frozen_after * 1000))}ms"
                with contextlib.suppress(psycopg.errors.UndefinedObject):  # before PostgreSQL 14: no bound
                    await conn.execute("SELECT set_config('idle_session_timeout', %s, false)", (timeout,))
                self._conn = conn
                if self._pinger is None or self._pinger.done():
                    self._pinger = asyncio.create_task(self._keep_alive(), name="executor-duty-locks-ping")
            return self._conn

    async def _keep_alive(self) -> None:
        """Speak on the session every third of frozen_after while it is open: only a silent
        (frozen) process loses it."""
        while (conn := self._conn) is not None and not conn.closed and not conn.broken:
            await asyncio.sleep(self._frozen_after / 3)
            with contextlib.suppress(psycopg.Error):  # a broken session: the next duty reconnects
                await conn.execute("SELECT 1")

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
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
            self._pinger = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
