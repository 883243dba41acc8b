"""Crash recovery against the real database, without starting any process: the
dead-worker sweep, the lost-run policy, fencing of late writes, the schedule-to-start
monitor, and recovery racing itself on two replicas.

Workers are rows (and, for the lock fast path, an advisory lock held on a connection
of the test); "dying" is a stale heartbeat or a released lock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conveyor.config import WorkerSettings
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus as S
from conveyor.executor.recovery import NOT_PICKED_UP, WORKER_LOST
from conveyor.store.db import connect_sync, make_pool
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.liveness import Liveness
from integration.builders import (
    SCHEMA,
    Conn,
    Pool,
    add_worker,
    age_scheduled,
    attempts,
    claim,
    finish,
    kill,
    recovery,
    release,
    request,
    row,
    scheduler,
    start_on,
    waiting_on_a_lock,
    worker_status,
)
from support.polling import until


@pytest.fixture
def lock_holder(db_url: str) -> Iterator[Conn]:
    """A separate session standing in for a live worker's liveness connection."""
    with connect_sync(db_url, SCHEMA, autocommit=True) as c:
        yield c


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


# ---------------------------------------------------------------------------
# Fencing: a worker that comes back after its execution was recovered
# ---------------------------------------------------------------------------


async def test_late_writes_of_a_recovered_attempt_are_refused(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    a = add_worker(conn, "wa")
    [eid] = request(conn, 1, "core.sleep", {"seconds": 60})
    assert await start_on(conn, pool, transport, a, eid) == 1
    kill(conn, a)  # partitioned, not dead: it still runs attempt 1
    await recovery(pool, transport).sweep()

    # Window 1: recovered, not yet dispatched again. A's late writes change nothing.
    requested = row(conn, eid)
    assert requested["status"] == "requested"
    assert finish(conn, a, eid, 1) == []
    assert finish(conn, a, eid, 1, status="failed") == []
    assert release(conn, a, eid, 1) == []
    assert row(conn, eid) | {"db_now": None} == requested | {"db_now": None}

    # Window 2: worker B runs it as attempt 2.
    b = add_worker(conn, "wb")
    assert await start_on(conn, pool, transport, b, eid) == 2
    running = row(conn, eid)
    assert (running["status"], running["worker"], running["attempt"]) == ("running", b, 2)
    history = attempts(conn, eid)

    # A comes back (heartbeats again) and reports attempt 1: refused, whatever it says ...
    conn.execute("UPDATE worker SET last_heartbeat = now(), status = 'active' WHERE id = %s", (a,))
    assert finish(conn, a, eid, 1) == []
    assert finish(conn, a, eid, 1, status="failed") == []
    assert finish(conn, a, eid, 1, status="timeout") == []
    # ... even quoting the current attempt number: the worker is part of the token.
    assert finish(conn, a, eid, 2) == []
    assert release(conn, a, eid, 1) == []
    assert release(conn, a, eid, 2) == []
    # B's attempt number from A's side is refused, and the recovered attempt is not B's to write.
    assert finish(conn, b, eid, 1) == []
    assert row(conn, eid) | {"db_now": None} == running | {"db_now": None}
    assert attempts(conn, eid) == history
    assert [(t["attempt"], t["worker"], t["outcome"]) for t in history] == [(1, a, "worker_lost"), (2, b, None)]

    # B's own result is recorded.
    assert finish(conn, b, eid, 2) == [eid]
    done = row(conn, eid)
    assert (done["status"], done["worker"], done["result"]) == ("completed", b, {"succeeded": True, "by": b})
    assert [(t["attempt"], t["outcome"]) for t in attempts(conn, eid)] == [(1, "worker_lost"), (2, "completed")]

    # After the end, nobody's late writes change anything.
    assert finish(conn, a, eid, 1, status="failed") == []
    assert release(conn, a, eid, 1) == []
    assert release(conn, b, eid, 2) == []
    assert finish(conn, b, eid, 2, status="failed") == []
    assert row(conn, eid) | {"db_now": None} == done | {"db_now": None}


async def test_a_late_release_after_redispatch_to_the_same_worker_is_refused(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """A worker that rejoins keeps its id: the attempt alone must fence its old copy."""
    a = add_worker(conn, "wa")
    [eid] = request(conn, 1, "core.sleep", {"seconds": 60})
    assert await start_on(conn, pool, transport, a, eid) == 1
    kill(conn, a)
    await recovery(pool, transport).sweep()
    conn.execute("UPDATE worker SET last_heartbeat = now(), status = 'active' WHERE id = %s", (a,))
    assert await start_on(conn, pool, transport, a, eid) == 2
    assert release(conn, a, eid, 1) == []
    assert finish(conn, a, eid, 1, status="failed") == []
    assert (row(conn, eid)["status"], row(conn, eid)["attempt"]) == ("running", 2)
    assert finish(conn, a, eid, 2) == [eid]


async def test_recovery_does_not_touch_an_execution_that_finished_meanwhile(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """The worker's result lands between the sweep's decision and its write: the guarded
    update (status and attempt) leaves the result alone."""
    w = add_worker(conn, "w1")
    [eid] = request(conn)
    attempt = await start_on(conn, pool, transport, w, eid)
    assert finish(conn, w, eid, attempt) == [eid]
    decisions = Decisions()
    decisions.add({"id": eid, "attempt": attempt}, Decision(S.REQUESTED, 0.0, WORKER_LOST))
    params = decisions.params(
        AttemptEnd.WORKER_LOST,
        by="recovery",
        from_statuses=(
            S.RUNNING,
            S.CANCELING,
        ),
    )
    assert conn.execute(Q["resolve_attempts"], params).fetchall() == []
    assert row(conn, eid)["status"] == "completed"
    assert [t["outcome"] for t in attempts(conn, eid)] == ["completed"]


# ---------------------------------------------------------------------------
# Schedule-to-start monitor
# ---------------------------------------------------------------------------


async def test_not_picked_up_is_rescheduled_elsewhere_then_failed(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    rec = recovery(pool, transport, executor={"scheduled_timeout": 60, "scheduled_timeout_reschedules": 1})
    a = add_worker(conn, "wa")
    [eid] = request(conn)
    await scheduler(pool, transport).run_round()
    assert row(conn, eid)["worker"] == a

    # Within the timeout: nothing.
    age_scheduled(conn, [eid], 59)
    assert await rec.check_scheduled_timeouts() == {}

    # Past it: back to requested, the attempt closed as not picked up.
    age_scheduled(conn, [eid], 61)
    assert await rec.check_scheduled_timeouts() == {"rescheduled": 1, "failed": 0}
    current = row(conn, eid)
    assert (current["status"], current["worker"], current["attempt"]) == ("requested", None, 1)
    assert [(t["attempt"], t["worker"], t["outcome"], t["error"]) for t in attempts(conn, eid)] == [
        (1, a, "not_picked_up", NOT_PICKED_UP)
    ]
    assert attempts(conn, eid)[0]["ended"] is not None

    # The next round avoids the worker that did not pick it up, though it is less loaded.
    b = add_worker(conn, "wb")
    [other] = request(conn)
    await scheduler(pool, transport).run_round()
    assert (row(conn, eid)["worker"], row(conn, eid)["attempt"]) == (b, 2)
    assert row(conn, other)["worker"] == a

    # Not picked up again: past the reschedules, failed with the seeds' message.
    age_scheduled(conn, [eid], 61)
    assert await rec.check_scheduled_timeouts() == {"rescheduled": 0, "failed": 1}
    failed = row(conn, eid)
    assert failed["status"] == "failed"
    assert failed["result"]["error"] == "Execution timeout: worker did not pick up task within timeout"
    assert failed["result"] == {
        "succeeded": False,
        "error": "Execution timeout: worker did not pick up task within timeout",
        "failed_by": "execution_timeout_monitor",
    }
    assert failed["ended"] is not None
    assert [(t["attempt"], t["worker"], t["outcome"]) for t in attempts(conn, eid)] == [
        (1, a, "not_picked_up"),
        (2, b, "not_picked_up"),
    ]
    # The other execution was never overdue.
    assert row(conn, other)["status"] == "scheduled"
    assert await rec.check_scheduled_timeouts() == {}


async def test_no_reschedules_fails_at_the_first_timeout(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    rec = recovery(pool, transport, executor={"scheduled_timeout": 1, "scheduled_timeout_reschedules": 0})
    add_worker(conn, "wa")
    [eid] = request(conn)
    await scheduler(pool, transport).run_round()
    age_scheduled(conn, [eid], 2)
    assert await rec.check_scheduled_timeouts() == {"rescheduled": 0, "failed": 1}
    assert row(conn, eid)["result"]["error"] == NOT_PICKED_UP


async def test_a_real_small_timeout_passes_with_time(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    """No clock games: the configured timeout elapses."""
    rec = recovery(pool, transport, executor={"scheduled_timeout": 0.3, "scheduled_timeout_reschedules": 0})
    add_worker(conn, "wa")
    [eid] = request(conn)
    await scheduler(pool, transport).run_round()
    result = await until(rec.check_scheduled_timeouts, timeout=10, what="the scheduled timeout passed", interval=0.05)
    assert result == {"rescheduled": 0, "failed": 1}
    assert row(conn, eid)["status"] == "failed"


async def test_per_action_scheduled_timeout_overrides_the_default(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    rec = recovery(pool, transport, executor={"scheduled_timeout": 60, "scheduled_timeout_reschedules": 0})
    conn.execute("""UPDATE action SET metadata = metadata || '{"scheduled_timeout": 5}' WHERE ref = 'core.echo'""")
    conn.execute("""UPDATE action SET metadata = metadata || '{"scheduled_timeout": 600}' WHERE ref = 'core.sleep'""")
    add_worker(conn, "wa")
    [short] = request(conn, 1, "core.echo", {"message": "x"})
    [default] = request(conn, 1, "core.noop")
    [long] = request(conn, 1, "core.sleep", {"seconds": 1})
    await scheduler(pool, transport).run_round()

    age_scheduled(conn, [short, default, long], 10)
    assert await rec.check_scheduled_timeouts() == {"rescheduled": 0, "failed": 1}
    assert row(conn, short)["status"] == "failed"

    age_scheduled(conn, [default, long], 120)
    assert await rec.check_scheduled_timeouts() == {"rescheduled": 0, "failed": 1}
    assert row(conn, default)["status"] == "failed"
    assert row(conn, long)["status"] == "scheduled"

    age_scheduled(conn, [long], 601)
    assert await rec.check_scheduled_timeouts() == {"rescheduled": 0, "failed": 1}
    assert row(conn, long)["status"] == "failed"


async def test_an_execution_that_started_meanwhile_is_untouched(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    rec = recovery(pool, transport, executor={"scheduled_timeout": 60, "scheduled_timeout_reschedules": 0})
    w = add_worker(conn, "wa")
    ids = request(conn, 2)
    await scheduler(pool, transport).run_round()
    age_scheduled(conn, ids, 120)

    # One was started before the check: no longer scheduled, nothing to do.
    [started] = claim(conn, w, limit=1)
    # The worker is claiming the other one right now (its transaction holds the row):
    # the check skips it, and the claim wins.
    with connect_sync(db_url, SCHEMA) as worker_conn:
        [racing] = worker_conn.execute(Q["claim_scheduled"], {"worker": w, "limit": 1}).fetchall()
        assert await rec.check_scheduled_timeouts() == {}
        worker_conn.commit()
    for eid in (started["id"], racing["id"]):
        assert row(conn, eid)["status"] == "running"
        assert [t["outcome"] for t in attempts(conn, eid)] == [None]
    assert await rec.check_scheduled_timeouts() == {}

    # And the guarded write refuses a decision taken on a stale read.
    decisions = Decisions()
    decisions.add({"id": started["id"], "attempt": 1}, Decision(S.FAILED, None, NOT_PICKED_UP))
    params = decisions.params(AttemptEnd.NOT_PICKED_UP, by="execution_timeout_monitor", from_statuses=(S.SCHEDULED,))
    assert conn.execute(Q["resolve_attempts"], params).fetchall() == []
    assert row(conn, started["id"])["status"] == "running"


async def test_completion_is_published_only_for_the_failed_ones(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    rec = recovery(pool, transport, executor={"scheduled_timeout": 60, "scheduled_timeout_reschedules": 0})
    add_worker(conn, "wa")
    ids = request(conn, 2)
    await scheduler(pool, transport).run_round()
    age_scheduled(conn, ids[:1], 120)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute('LISTEN "conveyor.completed"')
        assert await rec.check_scheduled_timeouts() == {"rescheduled": 0, "failed": 1}
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in notes] == [("conveyor.completed", str(ids[0]))]


# ---------------------------------------------------------------------------
# Recovery racing itself
# ---------------------------------------------------------------------------


async def test_concurrent_sweeps_recover_each_execution_once(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    dead = add_worker(conn, "w-dead", capacity=20)
    running = request(conn, 6, "core.sleep", {"seconds": 60})
    await scheduler(pool, transport).run_round()
    assert len(claim(conn, dead)) == 6
    scheduled = request(conn, 4)
    await scheduler(pool, transport).run_round()
    kill(conn, dead)

    other = make_pool(db_url, SCHEMA, "test-other", 6)
    await other.open()
    try:
        replicas = [recovery(pool, transport), recovery(other, transport), recovery(other, transport)]
        results = await asyncio.gather(*(r.sweep() for r in replicas for _ in range(3)))
    finally:
        await other.close()

    assert sum(r.get("dead", 0) for r in results) == 1
    assert sum(r.get("requeued", 0) for r in results) == 6
    assert sum(r.get("handed_back", 0) for r in results) == 4
    for eid in running:
        assert row(conn, eid)["status"] == "requested"
        assert [(t["attempt"], t["outcome"]) for t in attempts(conn, eid)] == [(1, "worker_lost")]
    for eid in scheduled:
        assert (row(conn, eid)["status"], row(conn, eid)["attempt"]) == ("requested", 0)
        assert attempts(conn, eid) == []


async def test_guarded_recovery_writes_win_once_without_the_sweep_lock(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """The sweep lock only saves work: two replicas applying the same decision at once
    (the second one blocked on the row, then re-checking it) move the execution once."""
    w = add_worker(conn, "w1")
    [eid] = request(conn)
    attempt = await start_on(conn, pool, transport, w, eid)
    kill(conn, w)
    decisions = Decisions()
    decisions.add({"id": eid, "attempt": attempt}, Decision(S.REQUESTED, 0.0, WORKER_LOST))
    params = decisions.params(
        AttemptEnd.WORKER_LOST,
        by="recovery",
        from_statuses=(
            S.RUNNING,
            S.CANCELING,
        ),
    )

    first = await psycopg.AsyncConnection.connect(db_url, options=f"-c search_path={SCHEMA}")
    second = await psycopg.AsyncConnection.connect(db_url, options=f"-c search_path={SCHEMA}")
    try:
        won = await (await first.execute(Q["resolve_attempts"], params)).fetchall()
        second_pid = second.info.backend_pid
        blocked = asyncio.ensure_future(second.execute(Q["resolve_attempts"], params))
        # Poll (with a deadline) until the server shows it waiting on the first one's row lock.
        await until(
            lambda: waiting_on_a_lock(conn, second_pid), timeout=10, what="the second update waited for the lock"
        )
        assert not blocked.done()
        await first.commit()
        lost = await (await blocked).fetchall()
        await second.commit()
    finally:
        await first.close()
        await second.close()
    assert len(won) == 1
    assert lost == []
    assert [(t["attempt"], t["outcome"]) for t in attempts(conn, eid)] == [(1, "worker_lost")]


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
        await second.close("inactive")


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
        await live.close("inactive")


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
