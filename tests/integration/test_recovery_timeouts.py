"""The schedule-to-start monitor against the real database: work dispatched but not
picked up in time is rescheduled elsewhere, then failed.

Workers are rows (and, for the lock fast path, an advisory lock held on a connection
of the test, the ``lock_holder`` fixture); "dying" is a stale heartbeat or a released lock."""

from __future__ import annotations

import psycopg

from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus as S
from conveyor.executor.recovery import NOT_PICKED_UP
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.transport.postgres import PostgresTransport
from integration.builders import (
    SCHEMA,
    Conn,
    Pool,
    add_worker,
    age_scheduled,
    attempts,
    claim,
    recovery,
    request,
    row,
    scheduler,
)
from support.polling import until

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
