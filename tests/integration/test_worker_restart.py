"""A worker restarted under the same name, or reconnecting after its session was
lost, against the real database: the lost run is recovered, a reconnect detaches
nothing, a missing lock is fatal only after the worker's grace.

Workers are rows (and, for the lock fast path, an advisory lock held on a connection
of the test, the ``lock_holder`` fixture); "dying" is a stale heartbeat or a released lock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from conveyor.config import WorkerSettings
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.liveness import Liveness
from integration.builders import (
    SCHEMA,
    Conn,
    Pool,
    add_worker,
    attempts,
    finish,
    recovery,
    request,
    row,
    scheduler,
    start_on,
    worker_status,
)
from support.polling import until

# ---------------------------------------------------------------------------
# A worker restarted under the same name
# ---------------------------------------------------------------------------


def _liveness(db_url: str, name: str) -> Liveness:
    async def nothing(*_: Any) -> None:
        return None

    registration = {"name": name, "runtimes": ["python", "shell"], "actions": ["core.noop", "core.sleep"],
                    "capabilities": Jsonb({}), "capacity": 10, "host": "test", "pid": 0, "version": "test"}  # fmt: skip
    return Liveness(db_url, SCHEMA, WorkerSettings(heartbeat_interval=1), registration, nothing, nothing)


async def test_restart_under_the_same_name_before_any_sweep_recovers_the_lost_run(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """A supervisor restarts a crashed worker with the same --name (or the same host-pid,
    e.g. pid 1 in a container) before an executor swept it: the new process takes over
    the row and the lock, so the worker looks alive -- its predecessor's run must still
    be recovered (per the lost-worker policy), not left running forever."""
    first = _liveness(db_url, "w-fixed")
    worker_id = await first.start()
    try:
        [lost] = request(conn, 1, "core.sleep", {"seconds": 60})
        assert await start_on(conn, pool, transport, worker_id, lost) == 1
        [waiting] = request(conn)  # dispatched, not started: the new process may run it
        await scheduler(pool, transport).run_round()
    finally:
        await first._drop_connection()  # the process dies: its session (and lock) go
    second = _liveness(db_url, "w-fixed")
    try:
        assert await second.start() == worker_id
        assert worker_status(conn, worker_id) == "active"
        assert await recovery(pool, transport).sweep() == {"dead": 0, "handed_back": 0, "requeued": 1, "ended": 0}
        current = row(conn, lost)
        assert (current["status"], current["worker"]) == ("requested", None)
        assert [(t["attempt"], t["worker"], t["outcome"]) for t in attempts(conn, lost)] == [
            (1, worker_id, "worker_lost")
        ]
        assert (row(conn, waiting)["status"], row(conn, waiting)["worker"]) == ("scheduled", worker_id)
        # The predecessor's late result is refused.
        assert finish(conn, worker_id, lost, 1) == []
        # Dispatched again (to the new process), as attempt 2.
        assert await start_on(conn, pool, transport, worker_id, lost) == 2
    finally:
        await second.close()


_LOCK_HOLDER = (
    "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid = worker_lock_class()::oid AND l.objid = %s::oid"
)


def _lock_holder(conn: Conn, worker_id: int) -> int | None:
    """The backend holding the worker's liveness lock (in this database), if any."""
    found = conn.execute(_LOCK_HOLDER, (worker_id,)).fetchall()
    assert len(found) <= 1
    return int(found[0]["pid"]) if found else None


@pytest.mark.parametrize("server_restarted", [False, True], ids=["same-server", "server-restarted"])
async def test_a_reconnecting_process_detaches_nothing_at_registration(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport, server_restarted: bool
) -> None:
    """Only a process's first registration takes its predecessor's runs away. The same
    process reconnecting keeps them attached and carries on with them, after a server
    restart and after its session alone was dropped alike: it re-took its lock within
    its lock_grace, so no executor declares it dead."""
    lost: list[str] = []

    async def on_lost(reason: str) -> None:
        lost.append(reason)

    async def nothing() -> None:
        return None

    registration = {"name": "w-rejoin", "runtimes": ["python"], "actions": ["core.sleep"], "capabilities": Jsonb({}),
                    "capacity": 10, "host": "test", "pid": 0, "version": "test"}  # fmt: skip
    live = Liveness(db_url, SCHEMA, WorkerSettings(heartbeat_interval=2), registration, on_lost, nothing)
    worker_id = await live.start()
    beating = asyncio.create_task(live.run())
    try:
        [eid] = request(conn, 1, "core.sleep", {"seconds": 60})
        await start_on(conn, pool, transport, worker_id, eid)
        if server_restarted:
            live.lock_epoch = datetime(2000, 1, 1, tzinfo=UTC)  # as if taken under an earlier server
        old_session = _lock_holder(conn, worker_id)
        assert old_session is not None
        assert conn.execute("SELECT pg_terminate_backend(%s) AS ok", (old_session,)).fetchone()["ok"] is True

        def reconnected() -> bool:
            """The lock is held again, by a new session (and the heartbeat task never ended)."""
            if _lock_holder(conn, worker_id) not in (None, old_session):
                return True
            assert not beating.done()
            return False

        await until(reconnected, timeout=15, what="the worker reconnected", interval=0.05)
        assert live.worker_id == worker_id
        assert lost == []
        assert (row(conn, eid)["status"], row(conn, eid)["worker"]) == ("running", worker_id)
        assert await recovery(pool, transport).sweep() == {"dead": 0, "handed_back": 0, "requeued": 0, "ended": 0}
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        await live.close()


async def test_a_missing_lock_is_fatal_only_after_the_workers_grace(
    conn: Conn, lock_holder: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """A session dropped while the process lives (pg_terminate_backend, idle_session_timeout):
    the worker re-takes its lock within lock_grace and is not declared dead; a worker that
    does not is, once the grace has passed."""
    epoch = "pg_postmaster_start_time()"
    comes_back = add_worker(conn, "w-comes-back", lock_epoch=epoch, lock_grace=0.3)
    stays_gone = add_worker(conn, "w-stays-gone", lock_epoch=epoch, lock_grace=0.3)
    sweeper = recovery(pool, transport)
    assert (await sweeper.sweep())["dead"] == 0  # both noted, neither dead yet
    noted = conn.execute("SELECT id FROM worker WHERE lock_lost_at IS NOT NULL ORDER BY id").fetchall()
    assert [r["id"] for r in noted] == [comes_back, stays_gone]

    assert lock_holder.execute("SELECT acquire_worker_lock(%s) AS ok", (comes_back,)).fetchone()["ok"] is True
    conn.execute("UPDATE worker SET lock_lost_at = lock_lost_at - interval '1 second'")  # the grace has passed
    assert (await sweeper.sweep())["dead"] == 1
    rows = {r["id"]: r for r in conn.execute("SELECT id, status, lock_lost_at FROM worker").fetchall()}
    assert rows[stays_gone]["status"] == "inactive"
    assert rows[comes_back]["status"] == "active"
    assert rows[comes_back]["lock_lost_at"] is None  # found again: the note is cleared
