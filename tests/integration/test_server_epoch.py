"""The server epoch (migration 0011): a worker's missing liveness lock counts only in the
lifetime of the server it was taken in. Crash recovery empties the UNLOGGED table that
holds it -- simulated here with TRUNCATE, since the shared server is never crashed (the
real crash-restarts are in tests/acceptance/test_server_restart.py) -- and a clean
restart renews pg_postmaster_start_time(), simulated by ageing the stored one."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.recovery import Recovery
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import add_worker
from support.polling import until

Conn = psycopg.Connection[dict[str, Any]]
Pool = AsyncConnectionPool[Any]

CRASH = "TRUNCATE server_epoch"  # what crash recovery does to an UNLOGGED table
RESTART = "UPDATE server_epoch SET postmaster_start = postmaster_start - interval '1 day'"


def epoch(conn: Conn, function: str = "current_server_epoch") -> Any:
    found = conn.execute(f"SELECT {function}() AS e").fetchone()
    assert found is not None
    return found["e"]


def statuses(conn: Conn) -> dict[str, str]:
    return {r["name"]: r["status"] for r in conn.execute("SELECT name, status FROM worker").fetchall()}


def live(conn: Conn) -> list[str]:
    return [r["name"] for r in conn.execute(Q["live_workers"]).fetchall()]


async def sweep(pool: Pool, transport: PostgresTransport) -> dict[str, int]:
    return await Recovery(pool, Settings()).sweep()


def test_one_epoch_per_lifetime_of_the_server(conn: Conn) -> None:
    first = epoch(conn)
    assert first is not None  # the migration stamped the lifetime it ran in
    assert epoch(conn, "stamp_server_epoch") == first  # stamping again changes nothing

    conn.execute(CRASH)
    assert epoch(conn) is None  # none until a worker registers in the new lifetime
    second = epoch(conn, "stamp_server_epoch")
    assert second not in (None, first)
    assert epoch(conn) == second

    conn.execute(RESTART)
    assert epoch(conn) is None
    third = epoch(conn, "stamp_server_epoch")
    assert third not in (None, first, second)
    stored = conn.execute("SELECT postmaster_start = pg_postmaster_start_time() AS now FROM server_epoch").fetchone()
    assert stored == {"now": True}


@pytest.mark.parametrize("fault", [CRASH, RESTART], ids=["crash-restart", "restart"])
async def test_after_a_restart_missing_locks_wait_for_the_heartbeat(
    conn: Conn, lock_holder: Conn, pool: Pool, transport: PostgresTransport, fault: str
) -> None:
    alive = add_worker(conn, "w-alive", lock_epoch="stamp_server_epoch()")
    add_worker(conn, "w-silent", heartbeat="now() - interval '1 hour'", lock_epoch="stamp_server_epoch()")
    conn.execute(fault)  # every lock is gone with the server; both missed it

    # Lock missing but taken in an earlier epoch: not judged; the heartbeat decides -- and a
    # heartbeat's age counts from the new lifetime at the earliest (no worker could beat while
    # the server was down): the first sweep stamps the epoch and finds no one dead.
    assert live(conn) == ["w-alive"]
    assert (await sweep(pool, transport))["dead"] == 0
    assert statuses(conn) == {"w-alive": "active", "w-silent": "active"}
    # A threshold (stale_after, 30 s) after the server's return, still silent: dead.
    conn.execute("UPDATE server_epoch SET epoch = now() - interval '31 seconds'")
    assert (await sweep(pool, transport))["dead"] == 1
    assert statuses(conn) == {"w-alive": "active", "w-silent": "inactive"}

    # Another worker registers first in the new lifetime and stamps its epoch: the others'
    # old locks still do not count, its own does -- a process dying now is found at once.
    newcomer = add_worker(conn, "w-new", lock_epoch="stamp_server_epoch()")
    assert lock_holder.execute("SELECT acquire_worker_lock(%s) AS ok", (newcomer,)).fetchone() == {"ok": True}
    assert (await sweep(pool, transport))["dead"] == 0
    assert live(conn) == ["w-alive", "w-new"]

    # w-alive re-registers (its epoch is the new one) without its lock: dead by the lock.
    conn.execute("UPDATE worker SET lock_epoch = stamp_server_epoch() WHERE id = %s", (alive,))
    assert (await sweep(pool, transport))["dead"] == 1
    assert statuses(conn) == {"w-alive": "inactive", "w-silent": "inactive", "w-new": "active"}

    lock_holder.close()  # w-new's process dies
    # The server releases the lock when its backend sees the socket close: soon, not at
    # once (found by CI: a sweep right after close() could still see it held).
    await until(lambda: conn.execute("SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                                     "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                                     "AND pid <> pg_backend_pid() AND granted) AS gone").fetchone()["gone"],
                what="w-new's liveness lock released")  # fmt: skip
    assert (await sweep(pool, transport))["dead"] == 1
    assert statuses(conn)["w-new"] == "inactive"
