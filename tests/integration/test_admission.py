"""Admission policies against the real database: limits, strict FIFO per group, and a
slot released exactly once whichever way an execution ends, through the product's own
code paths (scheduler, worker queries, recovery, timeouts, dead letters, cancel)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conveyor.config import Settings
from conveyor.domain.errors import ConflictError
from conveyor.domain.status import TERMINAL
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import (
    SCHEMA,
    Conn,
    Pool,
    add_worker,
    age_scheduled,
    claim,
    client_of,
    finish,
    holders,
    kill,
    policy,
    recovery,
    release,
    request,
    row,
    run_one,
    scheduler,
    status,
    waiters,
)

# ---------------------------------------------------------------------------
# Limits and FIFO
# ---------------------------------------------------------------------------


async def test_a_limit_of_one_runs_a_group_in_request_order_across_replicas(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    """Admitted by whichever replica's round, finished by the worker: the next in request
    order is promoted in the finishing transaction, and only it becomes schedulable."""
    w = add_worker(conn, "w1")
    policy(conn, "core.echo", 1, ("message",))
    a = request(conn, 3, "core.echo", {"message": "a"})
    b = request(conn, 2, "core.echo", {"message": "b"})
    assert holders(conn) == [a[0], b[0]]
    assert waiters(conn) == [a[1], a[2], b[1]]
    assert (await scheduler(pool, transport, "ex-b").run_round()).dispatched == 2
    assert sorted(r["id"] for r in claim(conn, w)) == [a[0], b[0]]
    # Nothing else is claimable, by any replica, while the heads hold the slots.
    for ex in ("ex-a", "ex-b"):
        assert (await scheduler(pool, transport, ex).run_round()).claimed == 0
    order = []
    for i, eid in enumerate([a[0], b[0], a[1]]):
        assert finish(conn, w, eid, row(conn, eid)["attempt"]) == [eid]
        order.append(await run_one(conn, pool, transport, w, "ex-a" if i % 2 else "ex-b"))
    assert order == [a[1], b[1], a[2]]
    assert holders(conn) == [a[2], b[1]]
    assert waiters(conn) == []


async def test_the_limit_holds_and_waiters_are_never_claimed(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    w = add_worker(conn, "w1", capacity=50)
    policy(conn, "core", 3)  # pack scope: every core.* action shares three slots
    ids = request(conn, 6, "core.noop") + request(conn, 4, "core.echo", {"message": "x"})
    result = await scheduler(pool, transport, "ex-a").run_round()
    assert result.dispatched == 3
    assert {e for e in ids if status(conn, e) == "scheduled"} == set(ids[:3])
    assert waiters(conn) == ids[3:]
    # Every round after that, by any replica, finds nothing: the waiters stay requested.
    for ex in ("ex-a", "ex-b"):
        assert (await scheduler(pool, transport, ex).run_round()).claimed == 0
    assert [status(conn, e) for e in ids[3:]] == ["requested"] * 7
    del w


async def test_the_most_specific_policy_governs(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    policy(conn, "*", 1)
    policy(conn, "core", 2)
    policy(conn, "core.echo", 5)
    echo = request(conn, 6, "core.echo", {"message": "x"})
    noop = request(conn, 3, "core.noop")
    governing = {
        r["execution"]: r["policy"]
        for r in conn.execute(
            "SELECT execution, policy FROM execution_admission_slot UNION ALL "
            "SELECT execution, policy FROM execution_admission_queue"
        )
    }
    assert {governing[e] for e in echo} == {"core.echo"}
    assert {governing[e] for e in noop} == {"core"}
    assert len(holders(conn)) == 5 + 2


def test_cancel_method_refuses_with_the_reason_and_loses_nothing(conn: Conn) -> None:
    policy(conn, "core.echo", 1, ("message",), method="cancel")
    first, second = request(conn, 2, "core.echo", {"message": "x"})
    (other,) = request(conn, 1, "core.echo", {"message": "y"})
    assert status(conn, first) == "requested"
    assert status(conn, other) == "requested"
    refused = row(conn, second)
    assert refused["status"] == "cancelled"
    assert refused["result"]["cancelled_by"] == "admission"
    assert "concurrency limit reached: policy core.echo allows 1 at once" in refused["result"]["error"]
    assert '"message": "x"' in refused["result"]["error"]
    assert holders(conn) == [first, other]
    assert waiters(conn) == []


def test_raising_a_limit_admits_at_once_and_deleting_a_policy_frees_its_waiters(conn: Conn) -> None:
    policy(conn, "core.noop", 1)
    ids = request(conn, 4, "core.noop")
    assert (holders(conn), waiters(conn)) == ([ids[0]], ids[1:])
    policy(conn, "core.noop", 3)
    assert (holders(conn), waiters(conn)) == (ids[:3], [ids[3]])
    conn.execute(Q["delete_policy"], {"target": "core.noop"})
    assert (holders(conn), waiters(conn)) == ([], [])
    assert [status(conn, e) for e in ids] == ["requested"] * 4


def test_a_policy_in_action_metadata_follows_registration_but_not_over_an_operator(conn: Conn) -> None:
    conn.execute("UPDATE action SET metadata = metadata || %s WHERE ref = 'core.sleep'",
                 (Jsonb({"policy": {"concurrency": 2, "parameters": ["seconds"]}}),))  # fmt: skip
    got = conn.execute("SELECT * FROM admission_policy WHERE target = 'core.sleep'").fetchone()
    assert (got["concurrency"], got["parameters"], got["method"], got["source"]) == (
        2,
        ["seconds"],
        "enqueue",
        "metadata",
    )
    policy(conn, "core.sleep", 7)
    conn.execute("UPDATE action SET metadata = metadata || %s WHERE ref = 'core.sleep'",
                 (Jsonb({"policy": {"concurrency": 3}}),))  # fmt: skip
    got = conn.execute("SELECT * FROM admission_policy WHERE target = 'core.sleep'").fetchone()
    assert (got["concurrency"], got["source"]) == (7, "operator")


# ---------------------------------------------------------------------------
# Released exactly once, whichever way it ends
# ---------------------------------------------------------------------------

Ending = Callable[[Conn, Pool, PostgresTransport, int, int], Awaitable[None]]


async def _completed(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await run_one(conn, pool, transport, w)
    assert finish(conn, w, eid, row(conn, eid)["attempt"]) == [eid]


async def _failed(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await run_one(conn, pool, transport, w)
    assert finish(conn, w, eid, row(conn, eid)["attempt"], "failed") == [eid]


async def _timeout(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await run_one(conn, pool, transport, w)
    assert finish(conn, w, eid, row(conn, eid)["attempt"], "timeout") == [eid]


async def _cancelled_running(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await run_one(conn, pool, transport, w)
    with client_of(conn) as client:
        assert client.cancel(eid) == "canceling"
    assert holders(conn)[0] == eid  # still running until its worker stops it
    assert finish(conn, w, eid, row(conn, eid)["attempt"], "failed") == [eid]  # recorded as cancelled


async def _cancelled_before_dispatch(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    with client_of(conn) as client:
        assert client.cancel(eid) == "cancelled"


async def _cancelled_when_scheduled(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await scheduler(pool, transport, "ex-a").run_round()
    assert status(conn, eid) == "scheduled"
    with client_of(conn) as client:
        assert client.cancel(eid) == "cancelled"


async def _abandoned(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await run_one(conn, pool, transport, w)
    kill(conn, w)
    rec = recovery(pool, transport, recovery={"on_worker_lost": "abandon"})
    await rec.sweep()
    assert status(conn, eid) == "abandoned"


async def _scheduled_timeout(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await scheduler(pool, transport, "ex-a").run_round()
    age_scheduled(conn, [eid], 3600)
    rec = recovery(pool, transport, executor={"scheduled_timeout": 60, "scheduled_timeout_reschedules": 0})
    await rec.check_scheduled_timeouts()
    assert status(conn, eid) == "failed"


async def _dead_lettered(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    await scheduler(pool, transport, "ex-a").run_round()
    age_scheduled(conn, [eid], 3600)
    settings = Settings(executor={"scheduled_timeout_reschedules": 0})
    handler = DeadLetterHandler(pool, transport, settings, "ex-a")
    assert await handler.expire_dispatches() == 1
    assert status(conn, eid) == "failed"


async def _failed_by_scheduler(conn: Conn, pool: Pool, transport: PostgresTransport, w: int, eid: int) -> None:
    # What no live worker can run fails after the grace (0 here): no worker has core.sleep.
    conn.execute("UPDATE worker SET actions = '{core.echo}' WHERE id = %s", (w,))
    await scheduler(pool, transport, "ex-a").run_round()
    assert status(conn, eid) == "failed"


ENDINGS: dict[str, Ending] = {
    "completed": _completed,
    "failed": _failed,
    "timeout": _timeout,
    "cancelled-running": _cancelled_running,
    "cancelled-before-dispatch": _cancelled_before_dispatch,
    "cancelled-when-scheduled": _cancelled_when_scheduled,
    "abandoned": _abandoned,
    "scheduled-timeout": _scheduled_timeout,
    "dead-lettered": _dead_lettered,
    "failed-by-scheduler": _failed_by_scheduler,
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_every_ending_releases_the_slot_once_and_promotes_the_next(
    ending: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    w = add_worker(conn, "w1")
    policy(conn, "core.sleep", 1)
    first, second, third = request(conn, 3, "core.sleep", {"seconds": 1})
    assert (holders(conn), waiters(conn)) == ([first], [second, third])
    await ENDINGS[ending](conn, pool, transport, w, first)
    assert row(conn, first)["status"] in TERMINAL
    assert (holders(conn), waiters(conn)) == ([second], [third])
    # The same ending delivered again (a duplicate message, a second replica) changes nothing.
    conn.execute("UPDATE execution SET result = result WHERE id = %s", (first,))
    conn.execute("UPDATE execution SET status = status WHERE id = %s", (first,))
    assert (holders(conn), waiters(conn)) == ([second], [third])


async def test_a_waiter_cancelled_leaves_the_line_and_keeps_the_order(conn: Conn) -> None:
    policy(conn, "core.noop", 1)
    ids = request(conn, 4, "core.noop")
    with client_of(conn) as client:
        assert client.cancel(ids[2]) == "cancelled"
    assert (holders(conn), waiters(conn)) == ([ids[0]], [ids[1], ids[3]])


async def test_a_rerun_after_a_lost_worker_keeps_its_slot(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    """Running -> requested (its worker lost, retry allowed) is not an ending: the slot
    stays, so a waiter cannot overtake the execution being run again."""
    w = add_worker(conn, "w1")
    policy(conn, "core.noop", 1)
    first, second = request(conn, 2, "core.noop")
    await run_one(conn, pool, transport, w)
    assert release(conn, w, first, row(conn, first)["attempt"])
    assert status(conn, first) == "requested"
    assert (holders(conn), waiters(conn)) == ([first], [second])
    conn.execute("UPDATE worker SET status = 'inactive' WHERE id = %s", (w,))
    w2 = add_worker(conn, "w2")
    assert await run_one(conn, pool, transport, w2) == first


# ---------------------------------------------------------------------------
# Crash windows and concurrency
# ---------------------------------------------------------------------------


def test_a_crash_between_release_and_promotion_is_impossible(db_url: str, conn: Conn) -> None:
    """Release and promotion are one transaction: a session killed after the ending's
    UPDATE (slot freed, next admitted inside it) leaves everything as before; committed,
    both are there."""
    policy(conn, "core.noop", 1)
    first, second = request(conn, 2, "core.noop")
    with connect_sync(db_url, SCHEMA) as victim:
        victim.execute("UPDATE execution SET status = 'cancelled' WHERE id = %s", (first,))
        inside = [r["execution"] for r in victim.execute("SELECT execution FROM execution_admission_slot")]
        assert inside == [second]
        pid = victim.info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
    assert (holders(conn), waiters(conn)) == ([first], [second])
    assert status(conn, first) == "requested"
    conn.execute("UPDATE execution SET status = 'cancelled' WHERE id = %s", (first,))
    assert (holders(conn), waiters(conn)) == ([second], [])


def test_concurrent_requesters_and_finishers_keep_limits_and_order(db_url: str, conn: Conn) -> None:
    """Eight sessions request into four groups in batches whose group order differs, while
    others end holders: no deadlock, every group numbered without gaps, no group over
    its limit, and FIFO intact (every holder's number below every waiter's)."""
    policy(conn, "core.echo", 2, ("message",))
    groups = ["a", "b", "c", "d"]
    errors: list[BaseException] = []

    def requester(k: int) -> None:
        try:
            with connect_sync(db_url, SCHEMA, autocommit=True) as c:
                for i in range(15):
                    order = groups[k % 4 :] + groups[: k % 4]
                    if (i + k) % 2:
                        order.reverse()
                    c.execute(Q["request_many"], {"refs": ["core.echo"] * 4,
                                                  "parameters": [Jsonb({"message": g}) for g in order]})  # fmt: skip
        except BaseException as exc:  # reported below
            errors.append(exc)

    def finisher() -> None:
        try:
            with connect_sync(db_url, SCHEMA, autocommit=True) as c:
                for _ in range(40):
                    # Three random holders, locked in id order: two finishers taking rows in
                    # different orders deadlock with each other (the test's own race, not
                    # the one under test: seen in a CI run).
                    c.execute("UPDATE execution SET status = 'cancelled' WHERE id IN (SELECT id FROM execution"
                              " WHERE id IN (SELECT execution FROM execution_admission_slot ORDER BY random()"
                              " LIMIT 3) ORDER BY id FOR UPDATE)")  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=requester, args=(k,)) for k in range(8)]
    threads += [threading.Thread(target=finisher) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for g in groups:
        key = Jsonb({"message": g})
        held = conn.execute("SELECT seq FROM execution_admission_slot WHERE group_key = %s", (key,)).fetchall()
        waiting = conn.execute("SELECT seq FROM execution_admission_queue WHERE group_key = %s", (key,)).fetchall()
        assert len(held) <= 2
        if waiting:
            assert len(held) == 2, "a free slot with someone waiting"
            assert max(r["seq"] for r in held) < min(r["seq"] for r in waiting)
        seqs = conn.execute("SELECT next_seq FROM execution_admission_group WHERE group_key = %s", (key,)).fetchone()
        assert seqs["next_seq"] == 8 * 15
    total = conn.execute("SELECT count(*) AS n FROM execution WHERE action_ref = 'core.echo'").fetchone()["n"]
    assert total == 8 * 15 * 4


async def test_repair_admits_what_the_triggers_could_not_see(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    policy(conn, "core.noop", 1)
    first, second = request(conn, 2, "core.noop")
    conn.execute("DELETE FROM execution_admission_slot WHERE execution = %s", (first,))  # by hand
    assert await scheduler(pool, transport, "ex-a").repair_admission() == 1
    assert holders(conn) == [second]
    assert await scheduler(pool, transport, "ex-a").repair_admission() == 0


async def test_idle_groups_are_forgotten_busy_ones_kept(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    policy(conn, "core.echo", 1, ("message",))
    (idle,) = request(conn, 1, "core.echo", {"message": "idle"})
    request(conn, 1, "core.echo", {"message": "busy"})
    with client_of(conn) as client:
        client.cancel(idle)
    conn.execute("UPDATE execution_admission_group SET touched = now() - interval '2 hours'")
    await scheduler(pool, transport, "ex-a").repair_admission()
    left = [r["group_key"] for r in conn.execute("SELECT group_key FROM execution_admission_group")]
    assert left == [{"message": "busy"}]


async def test_cancel_is_idempotent_while_canceling(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    """Any non-terminal state may be cancelled: asked again while its worker stops it, the
    answer is the same and nothing changes; once it ended, it is a conflict."""
    w = add_worker(conn, "w1")
    (eid,) = request(conn, 1, "core.noop")
    await run_one(conn, pool, transport, w)
    with client_of(conn) as client:
        assert client.cancel(eid) == "canceling"
        assert client.cancel(eid) == "canceling"
        assert finish(conn, w, eid, row(conn, eid)["attempt"]) == [eid]
        assert status(conn, eid) == "cancelled"
        with pytest.raises(ConflictError, match="is cancelled: nothing to cancel"):
            client.cancel(eid)
