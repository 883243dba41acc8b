"""An executor's liveness: one dedicated session for its whole life, which the other
replicas read to hand its scheduling claims back at once when it is gone.

A claim (requested -> scheduling, committed) waits for its executor's dispatch. An executor
that dies or freezes between the two used to leave it for ``executor.claim_timeout``
(30 s). Now every executor holds a session named after the last 12 hex digits of its id
(``conveyor-executor-liveness <hex> [<process tag>]``, on the direct URL), and every
replica asks every ``executor_liveness.check_interval`` for claims whose executor has no
such session (``release_gone_executor_claims``):

- killed: the kernel closes the socket and the server ends the session within
  milliseconds;
- frozen (SIGSTOP, a paused VM: the kernel still answers the keepalives): the session
  carries ``idle_session_timeout = frozen_after`` and is pinged every third of it, so the
  server ends it once the process has not spoken for that long -- the database's clock
  decides, not a peer's.

A live executor whose session drops (a stall past the bound, a proxy) reconnects at the
next ping; the claims released meanwhile are harmless: every dispatch write is guarded on
(status, executor), so its round finds them gone and they are claimed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import psycopg
import structlog

from conveyor.config import ExecutorLivenessSettings
from conveyor.store.db import Row, connect

log = structlog.get_logger(__name__)

NAME = "conveyor-executor-liveness"


def new_liveness_key() -> str:
    """12 lowercase hex digits: the end of the executor's id and its session's name
    (what release_gone_executor_claims matches)."""
    return secrets.token_hex(6)


class ExecutorLiveness:
    def __init__(self, url: str, schema: str, key: str, cfg: ExecutorLivenessSettings) -> None:
        self._url, self._schema, self._key = url, schema, key
        self._frozen_after = cfg.frozen_after
        self._ping = cfg.frozen_after / 3
        self._conn: psycopg.AsyncConnection[Row] | None = None
        self.connected = False

    async def open(self) -> None:
        """Connect now (before the first claim); an outage is left to ``run`` to retry."""
        try:
            await self._connect()
        except psycopg.Error as exc:
            log.warning("executor liveness session not opened yet; retrying", error=str(exc).strip())

    async def _connect(self) -> None:
        conn = await connect(self._url, self._schema, f"{NAME} {self._key}", autocommit=True)
        try:
            timeout = f"{max(1, round(self._frozen_after * 1000))}ms"
            await conn.execute("SELECT set_config('idle_session_timeout', %s, false)", (timeout,))
        except psycopg.errors.UndefinedObject:  # PostgreSQL before 14: a kill is still seen at once
            log.warning(
                "idle_session_timeout unknown to this server: a frozen executor's claims wait for "
                "executor.claim_timeout"
            )
        except BaseException:
            await conn.close()
            raise
        self._conn, self.connected = conn, True

    async def run(self, stop: asyncio.Event) -> None:
        """Speak on the session every third of frozen_after; reconnect when it is gone."""
        while True:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    await self._connect()
                    log.info("executor liveness session reopened; claims released meanwhile are claimed again")
                assert self._conn is not None
                await self._conn.execute("SELECT 1")
            except psycopg.Error as exc:
                # Ended by the server (this process was stalled past frozen_after: the other
                # replicas have handed back its claims), or the database is away.
                self.connected = False
                log.warning("executor liveness session lost; reconnecting", error=str(exc).strip())
                await self._drop()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._ping):
                    await stop.wait()
            if stop.is_set():
                return

    async def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None

    async def close(self) -> None:
        self.connected = False
        await self._drop()
