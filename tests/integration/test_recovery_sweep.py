"""Crash recovery against the real database, without starting any process: the
dead-worker sweep (which workers are dead) and the lost-run policy (what becomes of
the scheduled and running work of a dead worker).

Workers are rows (and, for the lock fast path, an advisory lock held on a connection
of the test, the ``lock_holder`` fixture); "dying" is a stale heartbeat or a released lock."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from conveyor.executor.recovery import WORKER_LOST
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import (
    Conn,
    Pool,
    add_worker,
    attempts,
    claim,
    kill,
    recovery,
    request,
    row,
    scheduler,
    start_on,
    worker_status,
)

# ---------------------------------------------------------------------------
# Which workers are dead
# ---------------------------------------------------------------------------


async def test_stale_heartbeat_marks_a_worker_inactive(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    stale = add_worker(conn, "w-stale", heartbeat="now() - interval '31 seconds'", stale_after=30)
    fresh = add_worker(conn, "w-fresh", heartbeat="now() - interval '20 seconds'", stale_after=30)
    # Judged by its own bound, not a global one.
    short = add_worker(conn, "w-short", heartbeat="now() - interval '4 seconds'", stale_after=3)
    never = add_worker(conn, "w-never", heartbeat="NULL")
    draining = add_worker(conn, "w-draining", heartbeat="now() - interval '1 hour'", status="draining")

    result = await recovery(pool, transport).sweep()
    assert result["dead"] == 4
    assert {w: worker_status(conn, w) for w in (stale, fresh, short, never, draining)} == {
        stale: "inactive",
        fresh: "active",
        short: "inactive",
        never: "inactive",
        draining: "inactive",
    }
    # Guarded: nothing more to do.
    assert (await recovery(pool, transport).sweep())["dead"] == 0


async def test_after_a_restart_a_heartbeat_ages_from_the_new_server_lifetime(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """No worker could beat while the server was down: right after a restart (no epoch
    stamped in this lifetime yet) a heartbeat older than its bound is not a dead worker;
    the sweep stamps the epoch and judges it a threshold later (issue 25)."""
    outlasted = add_worker(conn, "w-outage", heartbeat="now() - interval '1 hour'", stale_after=30)
    # A new server lifetime: the recorded epoch belongs to another postmaster.
    conn.execute("UPDATE server_epoch SET postmaster_start = '2000-01-01'")
    assert conn.execute("SELECT current_server_epoch() AS e").fetchone()["e"] is None

    assert (await recovery(pool, transport).sweep())["dead"] == 0
    assert worker_status(conn, outlasted) == "active"
    assert conn.execute("SELECT current_server_epoch() IS NOT NULL AS stamped").fetchone()["stamped"] is True

    # Still silent a threshold after the server's return: dead.
    conn.execute("UPDATE server_epoch SET epoch = now() - interval '31 seconds'")
    assert (await recovery(pool, transport).sweep())["dead"] == 1
    assert worker_status(conn, outlasted) == "inactive"


async def test_released_lock_marks_a_worker_inactive_at_once(
    conn: Conn, lock_holder: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    epoch = "pg_postmaster_start_time()"
    released = add_worker(conn, "w-released", lock_epoch=epoch)
    held = add_worker(conn, "w-held", lock_epoch=epoch)
    older_server = add_worker(conn, "w-older-server", lock_epoch="'2000-01-01'::timestamptz")
    assert lock_holder.execute("SELECT acquire_worker_lock(%s) AS ok", (held,)).fetchone()["ok"] is True
    assert conn.execute("SELECT worker_lock_held(%s) AS h", (held,)).fetchone()["h"] is True
    assert conn.execute("SELECT worker_lock_held(%s) AS h", (released,)).fetchone()["h"] is False

    # The statement tells why: a lock released while the heartbeat is fresh.
    with conn.transaction():
        conn.execute(Q["note_lost_locks"])
        dead = conn.execute(Q["deactivate_dead_workers"]).fetchall()
        assert [(d["id"], d["lock_lost"]) for d in dead] == [(released, True)]
        assert 0 <= dead[0]["heartbeat_age"] < 5
        raise psycopg.Rollback()

    result = await recovery(pool, transport).sweep()
    assert result["dead"] == 1
    assert worker_status(conn, released) == "inactive"
    assert worker_status(conn, held) == "active"
    # Locks taken under another server lifetime are all gone: only the heartbeat can tell.
    assert worker_status(conn, older_server) == "active"

    # The holder's session ends (its process died): dead at the next sweep.
    lock_holder.close()
    assert (await recovery(pool, transport).sweep())["dead"] == 1
    assert worker_status(conn, held) == "inactive"
    assert worker_status(conn, older_server) == "active"


async def test_a_lock_held_by_another_schema_does_not_keep_a_worker_alive(
    conn: Conn, lock_holder: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """The lock is keyed by (schema, id): a same-numbered lock of another installation
    (or a plain advisory lock on the id) is not this worker's."""
    w = add_worker(conn, "w1", lock_epoch="pg_postmaster_start_time()")
    lock_holder.execute("SELECT pg_advisory_lock(%s)", (w,))
    lock_holder.execute("SELECT pg_advisory_lock(12345, %s)", (w,))
    assert (await recovery(pool, transport).sweep())["dead"] == 1
    assert worker_status(conn, w) == "inactive"


# ---------------------------------------------------------------------------
# scheduled work of a dead worker
# ---------------------------------------------------------------------------


async def test_scheduled_on_a_dead_worker_is_handed_back_without_an_attempt(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    a = add_worker(conn, "wa", lock_epoch="pg_postmaster_start_time()")  # lock not held: dead at once
    ids = request(conn, 3)
    before = {eid: row(conn, eid)["attempt"] for eid in ids}
    assert before == dict.fromkeys(ids, 0)
    # Dispatched by a round that saw it alive (the lock is not checked when the epoch differs).
    conn.execute("UPDATE worker SET lock_epoch = NULL WHERE id = %s", (a,))
    assert (await scheduler(pool, transport).run_round()).dispatched == 3
    assert {row(conn, eid)["attempt"] for eid in ids} == {1}
    assert conn.execute("SELECT count(*) AS n FROM execution_attempt").fetchone()["n"] == 3
    conn.execute("UPDATE worker SET lock_epoch = pg_postmaster_start_time() WHERE id = %s", (a,))

    result = await recovery(pool, transport).sweep()
    assert result == {"dead": 1, "handed_back": 3, "requeued": 0, "ended": 0}
    for eid in ids:
        current = row(conn, eid)
        assert current["status"] == "requested"
        assert current["attempt"] == before[eid]
        assert (current["worker"], current["executor"], current["scheduled"], current["started"]) == (
            None,
            None,
            None,
            None,
        )
        assert attempts(conn, eid) == []

    # Rescheduled on a live worker, as its first attempt.
    b = add_worker(conn, "wb")
    assert (await scheduler(pool, transport).run_round()).dispatched == 3
    for eid in ids:
        assert (row(conn, eid)["worker"], row(conn, eid)["attempt"]) == (b, 1)
        assert [(t["attempt"], t["worker_name"]) for t in attempts(conn, eid)] == [(1, "wb")]


async def test_scheduled_on_a_live_worker_stays(
    conn: Conn, lock_holder: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    a = add_worker(conn, "wa", lock_epoch="pg_postmaster_start_time()")
    lock_holder.execute("SELECT acquire_worker_lock(%s)", (a,))
    [eid] = request(conn)
    await scheduler(pool, transport).run_round()
    assert await recovery(pool, transport).sweep() == {"dead": 0, "handed_back": 0, "requeued": 0, "ended": 0}
    assert (row(conn, eid)["status"], row(conn, eid)["worker"]) == ("scheduled", a)


# ---------------------------------------------------------------------------
# running work of a dead worker
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bound", [1, 2, 3])
async def test_lost_runs_are_rerun_with_backoff_up_to_the_bound_then_abandoned(
    conn: Conn, pool: Pool, transport: PostgresTransport, bound: int
) -> None:
    rec = recovery(pool, transport, recovery={"worker_lost_max_attempts": bound, "backoff_base": 1.0})
    [eid] = request(conn, 1, "core.sleep", {"seconds": 60})
    for lost in range(1, bound + 1):
        w = add_worker(conn, f"w{lost}")
        assert await start_on(conn, pool, transport, w, eid) == lost
        kill(conn, w)
        result = await rec.sweep()
        current = row(conn, eid)
        if lost < bound:
            assert result == {"dead": 1, "handed_back": 0, "requeued": 1, "ended": 0}
            assert current["status"] == "requested"
            assert (current["worker"], current["started"], current["ended"]) == (None, None, None)
            # The attempt number is kept; the next dispatch makes it lost + 1.
            assert current["attempt"] == lost
            wait = current["not_before"] - current["db_now"]
            if lost == 1:
                # The first re-run is immediate.
                assert wait <= timedelta(0)
            else:
                # Later ones after a jittered, doubling backoff: base * 2**(n-2) * [0.5, 1].
                ceiling = 2.0 ** (lost - 2)
                assert timedelta(seconds=ceiling * 0.5 - 0.05) <= wait <= timedelta(seconds=ceiling), wait
                # Not dispatched before its time, even with a live worker waiting.
                spare = add_worker(conn, f"spare{lost}")
                assert (await scheduler(pool, transport).run_round()).claimed == 0
                conn.execute("UPDATE worker SET status = 'inactive' WHERE id = %s", (spare,))
                conn.execute("UPDATE execution SET not_before = now() WHERE id = %s", (eid,))
        else:
            assert result == {"dead": 1, "handed_back": 0, "requeued": 0, "ended": 1}
            assert current["status"] == "abandoned"
            assert current["result"] == {"succeeded": False, "error": WORKER_LOST, "failed_by": "recovery"}
            assert current["ended"] is not None
            assert current["worker"] == w
            assert current["attempt"] == bound
    history = attempts(conn, eid)
    assert [(t["attempt"], t["worker_name"], t["outcome"], t["error"]) for t in history] == [
        (n, f"w{n}", "worker_lost", WORKER_LOST) for n in range(1, bound + 1)
    ]
    assert all(t["started"] is not None and t["ended"] is not None for t in history)
    # Nothing left to do.
    assert await rec.sweep() == {"dead": 0, "handed_back": 0, "requeued": 0, "ended": 0}


async def test_default_bound_is_three_lost_attempts(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    rec = recovery(pool, transport)
    [eid] = request(conn, 1, "core.sleep", {"seconds": 60})
    for lost in range(1, 4):
        w = add_worker(conn, f"w{lost}")
        conn.execute("UPDATE execution SET not_before = NULL WHERE id = %s", (eid,))
        await start_on(conn, pool, transport, w, eid)
        kill(conn, w)
        await rec.sweep()
    assert row(conn, eid)["status"] == "abandoned"
    assert [t["outcome"] for t in attempts(conn, eid)] == ["worker_lost"] * 3


async def test_action_on_worker_lost_abandon_is_abandoned_at_once(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    conn.execute(
        """UPDATE action SET metadata = metadata || '{"on_worker_lost": "abandon"}' WHERE ref = 'core.sleep'"""
    )
    w = add_worker(conn, "w1")
    [fragile] = request(conn, 1, "core.sleep", {"seconds": 60})
    [sturdy] = request(conn, 1, "core.noop")
    await scheduler(pool, transport).run_round()
    assert len(claim(conn, w)) == 2
    kill(conn, w)
    assert await recovery(pool, transport).sweep() == {"dead": 1, "handed_back": 0, "requeued": 1, "ended": 1}
    abandoned = row(conn, fragile)
    assert abandoned["status"] == "abandoned"
    assert abandoned["result"]["error"] == WORKER_LOST
    assert [(t["outcome"], t["error"]) for t in attempts(conn, fragile)] == [("worker_lost", WORKER_LOST)]
    assert row(conn, sturdy)["status"] == "requested"


async def test_configured_abandon_with_a_per_action_bound(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    conn.execute(
        """UPDATE action SET metadata = metadata || '{"on_worker_lost": "retry", "worker_lost_max_attempts": 5}'
           WHERE ref = 'core.sleep'"""
    )
    w = add_worker(conn, "w1")
    [kept] = request(conn, 1, "core.sleep", {"seconds": 60})
    [dropped] = request(conn, 1, "core.noop")
    await scheduler(pool, transport).run_round()
    claim(conn, w)
    kill(conn, w)
    await recovery(pool, transport, recovery={"on_worker_lost": "abandon"}).sweep()
    assert row(conn, kept)["status"] == "requested"
    assert row(conn, dropped)["status"] == "abandoned"


async def test_canceling_on_a_dead_worker_ends_cancelled(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    w = add_worker(conn, "w1")
    [eid] = request(conn)
    await start_on(conn, pool, transport, w, eid)
    conn.execute("UPDATE execution SET status = 'canceling' WHERE id = %s", (eid,))
    kill(conn, w)
    assert await recovery(pool, transport).sweep() == {"dead": 1, "handed_back": 0, "requeued": 0, "ended": 1}
    current = row(conn, eid)
    assert current["status"] == "cancelled"
    assert current["result"]["error"] == f"{WORKER_LOST} while cancelling"
    assert [t["outcome"] for t in attempts(conn, eid)] == ["worker_lost"]


async def test_work_of_a_deleted_worker_row_is_recovered(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    """The runbook deletes old worker rows (execution.worker is SET NULL)."""
    w = add_worker(conn, "w1")
    running, scheduled = request(conn, 2)
    await scheduler(pool, transport).run_round()
    claim(conn, w, limit=1)
    conn.execute("DELETE FROM worker WHERE id = %s", (w,))
    assert await recovery(pool, transport).sweep() == {"dead": 0, "handed_back": 1, "requeued": 1, "ended": 0}
    assert row(conn, running)["status"] == "requested"
    assert row(conn, scheduled)["status"] == "requested"
    assert [t["outcome"] for t in attempts(conn, running)] == ["worker_lost"]
    assert attempts(conn, scheduled) == []


async def test_running_on_a_live_worker_is_left_alone(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    w = add_worker(conn, "w1")
    [eid] = request(conn)
    await start_on(conn, pool, transport, w, eid)
    assert (await recovery(pool, transport).sweep())["requeued"] == 0
    assert row(conn, eid)["status"] == "running"
