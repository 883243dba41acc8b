"""Why a worker went inactive (``worker.inactive_reason``, ``inactive_since``, migration
0030), against the real database: each path that marks a worker inactive records its own
reason in the statement that does it, and a (re)registration clears it.

The graceful stop runs the worker's own liveness code (``Liveness.close``); the deaths are
rows judged by the executors' sweep, as in test_recovery_sweep.py and
test_recovery_process.py (a stale heartbeat, a lock gone past its grace, a lock gone with
no session of the process left)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from conveyor.config import WorkerSettings
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.liveness import Liveness
from integration.builders import SCHEMA, Conn, Pool, add_worker, recovery

EPOCH = "pg_postmaster_start_time()"  # the lock must be held in this server lifetime


def _liveness(db_url: str, name: str) -> Liveness:
    async def nothing(*_: Any) -> None:
        return None

    registration = {"name": name, "runtimes": ["python"], "actions": ["core.noop"], "capabilities": Jsonb({}),
                    "capacity": 2, "host": "test", "pid": 0, "version": "test"}  # fmt: skip
    return Liveness(db_url, SCHEMA, WorkerSettings(heartbeat_interval=1), registration, nothing, nothing)


def why(conn: Conn, worker: int) -> tuple[str, str | None, bool]:
    """(status, inactive_reason, inactive_since set within the last minute by the database clock)."""
    found = conn.execute(
        "SELECT status, inactive_reason, coalesce(inactive_since > now() - interval '1 minute', false) AS recent"
        " FROM worker WHERE id = %s",
        (worker,),
    ).fetchone()
    return found["status"], found["inactive_reason"], found["recent"]


async def test_a_graceful_stop_records_stopped_and_registering_again_clears_it(db_url: str, conn: Conn) -> None:
    first = _liveness(db_url, "w-graceful")
    worker = await first.start()
    assert why(conn, worker) == ("active", None, False)
    await first.close()
    assert why(conn, worker) == ("inactive", "stopped", True)

    again = _liveness(db_url, "w-graceful")
    try:
        assert await again.start() == worker
        assert why(conn, worker) == ("active", None, False)
        row = conn.execute("SELECT inactive_since FROM worker WHERE id = %s", (worker,)).fetchone()
        assert row["inactive_since"] is None
    finally:
        await again.close()


async def test_a_stop_after_being_declared_dead_keeps_the_executors_reason(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """Declared dead while partitioned, then stopped before it could register again: what
    happened to it is the death, not the stop."""
    proc = _liveness(db_url, "w-partitioned")
    worker = await proc.start()
    conn.execute("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (worker,))
    assert (await recovery(pool, transport).sweep())["dead"] == 1
    since = conn.execute("SELECT inactive_since FROM worker WHERE id = %s", (worker,)).fetchone()["inactive_since"]
    await proc.close()
    assert why(conn, worker) == ("inactive", "heartbeat_stale", True)
    assert (
        conn.execute("SELECT inactive_since FROM worker WHERE id = %s", (worker,)).fetchone()["inactive_since"] == since
    )


async def test_the_sweep_records_why_each_dead_worker_is_dead(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    stale = add_worker(conn, "w-stale", heartbeat="now() - interval '31 seconds'", stale_after=30)
    never = add_worker(conn, "w-never", heartbeat=None)
    draining = add_worker(conn, "w-draining", heartbeat="now() - interval '1 hour'", status="draining")
    # Lock gone, no session tag to look for: dead once its grace (0 here) has passed.
    lock = add_worker(conn, "w-lock", lock_epoch=EPOCH, lock_grace=0)
    # Lock gone and no session of its process left (its tag is nowhere): dead at once,
    # however long its grace.
    gone = add_worker(conn, "w-gone", lock_epoch=EPOCH, lock_grace=30)
    conn.execute(
        "UPDATE worker SET session_tag = 'aaaaaaaaaaaa', registered_at = now() - interval '1 second' WHERE id = %s",
        (gone,),
    )
    alive = add_worker(conn, "w-alive", heartbeat="now()")

    assert (await recovery(pool, transport).sweep())["dead"] == 5
    assert {w: why(conn, w) for w in (stale, never, draining, lock, gone, alive)} == {
        stale: ("inactive", "heartbeat_stale", True),
        never: ("inactive", "heartbeat_stale", True),
        draining: ("inactive", "heartbeat_stale", True),
        lock: ("inactive", "lock_lost", True),
        gone: ("inactive", "process_gone", True),
        alive: ("active", None, False),
    }


async def test_a_lock_judged_lost_wins_over_a_stale_heartbeat(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    both = add_worker(conn, "w-both", heartbeat="now() - interval '1 hour'", lock_epoch=EPOCH, lock_grace=0)
    assert (await recovery(pool, transport).sweep())["dead"] == 1
    assert why(conn, both) == ("inactive", "lock_lost", True)
