"""A worker's liveness: one dedicated connection for its whole life.

On it the worker takes a session-level advisory lock (keyed by its id) in the same
transaction that marks its row active, then heartbeats. The executors read two
signals from it:

- the lock: when the process dies the kernel closes the socket, PostgreSQL drops
  the session and the lock with it, and the worker is dead *now* -- told from a
  session dropped alone by the process's other sessions (its pool, its listener),
  which carry the same tag in their application_name (store/db.py, migration 0022):
  a dead process has none left, a live one keeps its lock_grace. Behind a transaction
  pooler (database.pooler) the pool's server sessions are shared and do not count
  (tagged ``<tag>``): only the direct ones do, the listener on the postgres transport;
  this connection always goes direct (database.direct_url);
- the heartbeat: older than the worker's own ``stale_after`` (interval x multiplier)
  means dead even when the lock lingers (a partition, a hung process). Keepalives on
  both ends of this connection make the server drop a vanished host's session after
  about that same bound.

From the worker's side, it stops everything it runs (``on_lost``) and later rejoins
(``on_rejoined``) when:

- a heartbeat finds its row ``inactive``: an executor declared it dead and is
  recovering its work;
- its session is dropped while the server stays up and it cannot take its lock again
  within ``lock_grace`` (executors declare it dead once the lock has been missing that
  long). Between beats the worker waits *on* this connection, so it notices a dropped
  session at once and reconnects at once;
- it could not heartbeat for ``self_fence_after`` (one interval less than the bound
  the executors use), checked by a watchdog on its own clock.

A server restart or crash-restart is none of these. Executors judge a missing lock only
in the server epoch it was taken in (``stamp_server_epoch()``, migration 0011: renewed
by a restart and by crash recovery alike), so afterwards only the heartbeat threshold
counts. The worker tells a server going down from its session alone being dropped by
what the server said: its session's last words (an immediate shutdown, a crash of
another backend) or its answer to a reconnection (shutting down, starting up, in
recovery; or no server at all right after it ended our session). Then the work carries
on and the worker keeps reconnecting; only the watchdog stops it, after
``self_fence_after``. When nothing says so (the session vanished, and the server cannot
be reached within ``lock_grace``), the worker cannot rule out a live server whose
executors are about to act, and stops its work.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import structlog
from psycopg.rows import dict_row

from conveyor.config import WorkerSettings
from conveyor.domain.errors import ConveyorError
from conveyor.domain.status import InactiveReason, WorkerStatus
from conveyor.store import transitions
from conveyor.store.db import PROCESS_TAG, AsyncConn, Row, conninfo_kwargs, server_restarting
from conveyor.store.queries import Q
from conveyor.worker.runners.isolated import Lease

log = structlog.get_logger(__name__)

# How often the worker tries to re-take its lock within lock_grace, and the first
# delay between reconnections after that (doubling up to a second).
_RETRY = 0.05
_BACKOFF = 0.1


class NameInUseError(ConveyorError):
    pass


class Liveness:
    def __init__(
        self,
        url: str,
        schema: str,
        cfg: WorkerSettings,
        registration: dict[str, Any],
        on_lost: Callable[[str], Awaitable[None]],
        on_rejoined: Callable[[], Awaitable[None]],
        on_new_server: Callable[[], None] | None = None,
        lease: Lease | None = None,
    ) -> None:
        # The isolated actions' lease (runners/isolated.py): renewed with last_ok, so that
        # a child stops itself when the worker would, even if the worker cannot tell it.
        self._lease = lease
        self._url = url
        self._schema = schema
        self._cfg = cfg
        self._registration = {
            **registration,
            "stale_after": cfg.staleness,
            "lock_grace": cfg.lock_grace,
            "session_tag": PROCESS_TAG,  # the tag of every session this process opens
            "status": WorkerStatus.ACTIVE,
        }
        self._on_lost = on_lost
        self._on_rejoined = on_rejoined
        self._on_new_server = on_new_server
        self._conn: AsyncConn | None = None
        self.worker_id: int | None = None
        self.lock_epoch: Any = None  # the server epoch our lock was taken in (migration 0011)
        self.last_ok = time.monotonic()
        self.fenced = False
        self.draining = False
        # What the server said when it ended our session (see _note_ending); reset by the
        # next connection it accepts.
        self._going_down: str | None = None
        self._ended_by_server = False
        # Set while the worker may claim work: registered, lock held, not fenced, not draining.
        self.accepting = asyncio.Event()

    @property
    def last_ok(self) -> float:
        """When (time.monotonic()) the worker last knew it stood: its last heartbeat."""
        return self._last_ok

    @last_ok.setter
    def last_ok(self, value: float) -> None:
        self._last_ok = value
        if self._lease is not None:
            self._lease.renew(value)

    @property
    def name(self) -> str:
        return str(self._registration["name"])

    async def start(self) -> int:
        """Connect, take the lock and register; refuse a name a live process holds."""
        await self._connect()
        await self._register()
        assert self.worker_id is not None
        return self.worker_id

    async def run(self) -> None:
        """Heartbeat until cancelled, with the self-fencing watchdog beside it."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watchdog(), name="worker-liveness-watchdog")
            await self._beat_loop()

    def begin_draining(self) -> None:
        """Shutdown has begun: take no work, and keep the row draining on any reconnect.
        (The caller records the status itself, through the pool: this connection spends
        its time waiting between beats.)"""
        self.draining = True
        self.accepting.clear()
        self._registration["status"] = WorkerStatus.DRAINING

    async def close(self, reason: InactiveReason = InactiveReason.STOPPED) -> None:
        """Record the row inactive and why; closing the connection releases the lock."""
        self.accepting.clear()
        if self._conn is not None and not self._conn.closed:
            status = WorkerStatus.INACTIVE
            try:
                async with asyncio.timeout(self._cfg.heartbeat_interval):
                    await transitions.set_worker_status(self._conn, self.worker_id, status, reason)
            except (psycopg.OperationalError, TimeoutError) as exc:
                log.warning("cannot record worker status", status=status, error=str(exc).strip())
            await self._conn.close()

    # -- internals --------------------------------------------------------------------

    async def _watchdog(self) -> None:
        """Self-fencing on the worker's own clock, however long a heartbeat attempt blocks."""
        period = min(0.25, self._cfg.heartbeat_interval / 4)
        while True:
            await asyncio.sleep(period)
            silent = time.monotonic() - self.last_ok
            if silent > self._cfg.self_fence_after and not self.fenced:
                await self._lost(f"no heartbeat for {silent:.1f}s (database unreachable or loop blocked)")

    async def _beat_loop(self) -> None:
        interval = self._cfg.heartbeat_interval
        next_beat = time.monotonic() + interval
        failures = 0
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    await self._reconnect()
                # Wait for the next beat on the connection itself: a session the server
                # drops raises here at once instead of at the next heartbeat.
                assert self._conn is not None
                remaining = next_beat - time.monotonic()
                if remaining > 0:
                    async for _ in self._conn.notifies(timeout=remaining):
                        pass
                next_beat = time.monotonic() + interval
                async with asyncio.timeout(interval):
                    row = await (await self._conn.execute(Q["heartbeat"], {"id": self.worker_id})).fetchone()
                    if row is None:
                        await self._lost("declared dead by an executor (heartbeat older than its bound)")
                        await self._register()
                self.last_ok = time.monotonic()
                failures = 0
                await self._resume()
            except (psycopg.OperationalError, TimeoutError, NameInUseError) as exc:
                if isinstance(exc, psycopg.Error):
                    self._note_ending(exc.diag)
                await self._drop_connection()
                failures += 1
                log.warning(
                    "heartbeat failed",
                    worker=self.name,
                    error=str(exc).strip() or type(exc).__name__,
                    silent_for=round(time.monotonic() - self.last_ok, 1),
                )
                if failures == 1:
                    await self._reconnect_within_grace()
                else:
                    await asyncio.sleep(min(_BACKOFF * 2 ** (failures - 2), 1.0, interval))

    async def _reconnect_within_grace(self) -> None:
        """Our session is gone. If the server merely dropped it, executors declare us dead
        once our lock has been missing for lock_grace: take it again before that, or stop
        our work -- it is about to run elsewhere. If the server itself is going down or
        coming up, no executor can judge our lock before it is back, and then in a new
        epoch, where only heartbeats count: the work carries on, the beat loop keeps
        reconnecting, and the watchdog stops the work only after self_fence_after."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self._cfg.lock_grace, _RETRY)
        epoch = self.lock_epoch
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._connect()
                    await self._register()
                break
            except (psycopg.OperationalError, TimeoutError, NameInUseError) as exc:
                await self._drop_connection()
                down = None if isinstance(exc, NameInUseError) else self._server_going_down(exc)
                if down is not None:
                    # What happens next depends on how long the server stays away: say so
                    # (issue 25: "the work carries on" was logged, then the work was stopped).
                    silent = time.monotonic() - self.last_ok
                    log.warning(
                        "database restarting; running executions carry on if it is back within stops_in "
                        "seconds, else this worker stops them and the executors re-run or abandon them "
                        "(on_worker_lost)",
                        worker=self.name,
                        evidence=down,
                        error=str(exc).strip() or type(exc).__name__,
                        stops_in=round(max(0.0, self._cfg.self_fence_after - silent), 1),
                        stops_after=self._cfg.self_fence_after,
                    )
                    return
                if isinstance(exc, NameInUseError) or loop.time() + _RETRY >= deadline:
                    reason = str(exc).strip() or type(exc).__name__
                    await self._lost(f"could not re-take the liveness lock within {self._cfg.lock_grace:g}s ({reason})")
                    return
                await asyncio.sleep(_RETRY)
        self.last_ok = time.monotonic()
        log.info(
            "liveness session re-established",
            worker=self.name,
            worker_id=self.worker_id,
            server_restarted=self.lock_epoch != epoch,
        )
        await self._resume()

    def _note_ending(self, diag: psycopg.errors.Diagnostic) -> None:
        """What the server said as it ended our session (an error, or a notice when it
        came between statements). 57P02: another backend crashed, the server resets every
        session and lock. 57P01 as a WARNING: an immediate shutdown's last words. 57P01 as
        FATAL: a fast shutdown -- or pg_terminate_backend of this session alone, so it
        counts only if no server answers our reconnection (_server_going_down)."""
        state = diag.sqlstate
        if state == "57P02" or (state == "57P01" and diag.severity_nonlocalized == "WARNING"):
            self._going_down = diag.message_primary or state
        elif state == "57P01":
            self._ended_by_server = True

    def _server_going_down(self, exc: BaseException) -> str | None:
        """Why we know the server itself is going down or coming up (not our session alone
        dropped), or None when nothing says so."""
        if self._going_down is not None:
            return self._going_down
        if server_restarting(exc):
            return "the server answered that it is shutting down or starting up"
        if self._ended_by_server and isinstance(exc, psycopg.OperationalError) and "FATAL:" not in str(exc):
            # Not pg_terminate_backend: after that the server still answers.
            return "the server ended our session, then no server answered"
        return None

    async def _reconnect(self) -> None:
        async with asyncio.timeout(self._cfg.heartbeat_interval):
            await self._connect()
            await self._register()
        self.last_ok = time.monotonic()
        await self._resume()

    async def _resume(self) -> None:
        """After a successful beat: rejoin if fenced, and take work again unless draining."""
        if self.fenced:
            try:
                await self._on_rejoined()
            except psycopg.Error as exc:
                log.warning("cannot release stopped executions yet", error=str(exc).strip())
                return
            self.fenced = False
            log.info("worker rejoined", worker=self.name, worker_id=self.worker_id)
        if not self.draining:
            self.accepting.set()

    async def _lost(self, reason: str) -> None:
        self.accepting.clear()
        if self.fenced:
            return
        self.fenced = True
        if self._lease is not None:
            self._lease.expire()  # its isolated actions stop at once: they are recovered elsewhere
        # Stopped runs are handed to recovery (releasing.Releaser.detach_stopped when it rejoins, or
        # the executors' sweep): each is re-run as a new attempt or abandoned, by its policy.
        log.error(
            "worker lost its standing; stopping its executions: the executors re-run them as a new attempt "
            "or abandon them (on_worker_lost)",
            worker=self.name,
            reason=reason,
        )
        await self._on_lost(reason)

    async def _connect(self) -> None:
        bound = self._cfg.staleness
        idle = max(1, math.floor(self._cfg.heartbeat_interval))
        interval = max(1, math.floor(idle / 2))
        count = max(1, math.ceil((bound - idle) / interval))
        kwargs = conninfo_kwargs(self._schema, "conveyor-worker-liveness")
        kwargs.update(
            keepalives_idle=idle,
            keepalives_interval=interval,
            keepalives_count=count,
            tcp_user_timeout=int(bound * 1000),
            connect_timeout=max(2, idle),
        )
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, row_factory=dict_row, **kwargs)
        # A server that accepts a connection is up: what it said before is history.
        self._going_down, self._ended_by_server = None, False
        conn.add_notice_handler(self._note_ending)
        await conn.execute(
            Q["session_keepalives"],
            {
                "idle": str(idle),
                "interval": str(interval),
                "count": str(count),
                "user_timeout_ms": str(int(bound * 1000)),
            },
        )
        self._conn = conn

    async def _register(self) -> None:
        """Take the row and the lock in one transaction."""
        assert self._conn is not None
        orphans: list[Row] = []
        async with self._conn.transaction():
            previous = await (await self._conn.execute(Q["worker_by_name"], {"name": self.name})).fetchone()
            row = await (await self._conn.execute(Q["register_worker"], self._registration)).fetchone()
            assert row is not None
            locked = await (await self._conn.execute(Q["acquire_worker_lock"], {"id": row["id"]})).fetchone()
            taken = bool(locked and locked["locked"])
            if not taken:
                raise psycopg.Rollback()  # leave the holder's row as it was
            if self.worker_id is None:  # this process's first registration: it runs nothing yet
                orphans = await (await self._conn.execute(Q["detach_orphaned_runs"], {"id": row["id"]})).fetchall()
        if orphans:
            log.warning(
                "executions of a previous process under this worker name left for recovery",
                worker=self.name,
                execution_ids=[o["id"] for o in orphans],
            )
        if not taken:
            raise NameInUseError(
                f"worker name {self.name!r} is held by a live worker process (its liveness lock is taken); "
                "give this worker another --name, or stop the other one"
            )
        if previous is not None and previous["status"] == WorkerStatus.INACTIVE and self.worker_id is not None:
            # Our row was marked dead while we were away: whatever we still run was recovered.
            await self._lost("declared dead while disconnected")
        self.worker_id = int(row["id"])
        renewed = self.lock_epoch is not None and row["lock_epoch"] != self.lock_epoch
        self.lock_epoch = row["lock_epoch"]
        if renewed and self._on_new_server is not None:
            # Another server lifetime: a restart keeps every commit, a failover to a
            # lagging standby does not -- the worker checks what the database says it runs.
            self._on_new_server()

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):  # already broken: nothing to close cleanly
                await conn.close()
