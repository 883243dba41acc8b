"""Fencing of late writes against the real database: a worker that comes back after
its execution was recovered changes nothing, and recovery racing itself on two replicas
recovers each execution once.

Workers are rows (and, for the lock fast path, an advisory lock held on a connection
of the test, the ``lock_holder`` fixture); "dying" is a stale heartbeat or a released lock."""

from __future__ import annotations

import asyncio

import psycopg

from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus as S
from conveyor.executor.recovery import WORKER_LOST
from conveyor.store.db import make_pool
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.transport.postgres import PostgresTransport
from integration.builders import (
    SCHEMA,
    Conn,
    Pool,
    add_worker,
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
)
from support.polling import until

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
