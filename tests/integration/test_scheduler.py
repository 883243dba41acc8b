"""The executor's scheduling round against the real database, without starting any
process: dispatch (least loaded, capacity, no live or capable worker, the grace), stale
claims, and concurrent executors."""

from __future__ import annotations

import asyncio

import psycopg
from psycopg.types.json import Jsonb

from conveyor.executor.scheduler import RoundResult
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, Pool, add_worker, claim, finish_all, request, rows, scheduler


def statuses(conn: Conn) -> dict[str, int]:
    return {r["status"]: r["n"] for r in conn.execute(Q["counts_by_status"]).fetchall()}


def loads(conn: Conn) -> dict[int, int]:
    return {
        r["id"]: r["load"]
        for r in conn.execute(
            "SELECT w.id, (SELECT count(*) FROM execution e WHERE e.worker = w.id "
            "AND e.status IN ('scheduled', 'running', 'canceling'))::int AS load FROM worker w"
        ).fetchall()
    }


# ---------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------


async def test_round_dispatches_to_a_live_worker(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    w = add_worker(conn, "w1")
    ids = request(conn, 3, "core.echo", {"message": "hi"})
    result = await scheduler(pool, transport).run_round()
    assert result == RoundResult(claimed=3, dispatched=3, failed=0, handed_back=0)
    for row in rows(conn, ids).values():
        assert row["status"] == "scheduled"
        assert row["worker"] == w
        assert row["attempt"] == 1
        assert row["executor"] == "ex-test"
        assert row["scheduled"] is not None
    attempts = conn.execute("SELECT * FROM execution_attempt ORDER BY execution").fetchall()
    assert [(a["execution"], a["attempt"], a["worker"], a["worker_name"]) for a in attempts] == [
        (eid, 1, w, "w1") for eid in ids
    ]
    assert all(a["started"] is None and a["outcome"] is None for a in attempts)
    # Nothing left: the next round is empty.
    assert await scheduler(pool, transport).run_round() == RoundResult(0, 0, 0, 0)


async def test_round_wakes_the_worker(db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    w = add_worker(conn, "w1")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "conveyor.worker.{w}"')
        request(conn)
        await scheduler(pool, transport).run_round()
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == [f"conveyor.worker.{w}"]


async def test_least_loaded_spread_across_two_workers(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    a = add_worker(conn, "wa", capacity=10)
    b = add_worker(conn, "wb", capacity=10)
    first = request(conn, 6)
    assert (await scheduler(pool, transport).run_round()).dispatched == 6
    assert loads(conn) == {a: 3, b: 3}
    assert {r["worker"] for r in rows(conn, first).values()} == {a, b}


async def test_least_loaded_wins_not_the_first(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    a = add_worker(conn, "wa", capacity=10)
    b = add_worker(conn, "wb", capacity=10)
    s = scheduler(pool, transport)
    # Give worker a (the first by id) two executions while b is down.
    conn.execute("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (b,))
    request(conn, 2)
    await s.run_round()
    assert loads(conn) == {a: 2, b: 0}
    conn.execute("UPDATE worker SET last_heartbeat = now() WHERE id = %s", (b,))
    nxt = request(conn, 1)
    await s.run_round()
    assert rows(conn, nxt)[nxt[0]]["worker"] == b
    more = request(conn, 3)
    await s.run_round()
    assert loads(conn) == {a: 3, b: 3}
    # b (1 of 10) first, then the tie at 2 goes to the lower id, then b again.
    assert [rows(conn, more)[eid]["worker"] for eid in more] == [b, a, b]


async def test_capacity_is_never_exceeded(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    w = add_worker(conn, "w1", capacity=3)
    ids = request(conn, 5)
    s = scheduler(pool, transport)
    result = await s.run_round()
    assert result.dispatched == 3
    assert result.failed == 0
    for _ in range(3):
        assert await s.run_round() == RoundResult(0, 0, 0, 0)
    assert loads(conn) == {w: 3}
    assert statuses(conn) == {"requested": 2, "scheduled": 3}
    assert {r["executor"] for r in rows(conn, ids).values() if r["status"] == "requested"} == {None}
    # A slot frees: exactly one more is dispatched.
    running = claim(conn, w, limit=1)
    assert finish_all(conn, w, [(running[0]["id"], running[0]["attempt"])]) == [running[0]["id"]]
    assert (await s.run_round()).dispatched == 1
    assert loads(conn) == {w: 3}
    assert statuses(conn) == {"requested": 1, "scheduled": 3, "completed": 1}


async def test_no_capacity_claims_are_handed_back_not_failed(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    # Free slots exist (on a worker that cannot run core.echo), so the round claims
    # more than the only capable worker can take; the excess goes back to requested.
    echo = add_worker(conn, "w-echo", capacity=1, actions="{core.echo}")
    add_worker(conn, "w-noop", capacity=5, actions="{core.noop}")
    ids = request(conn, 3, "core.echo", {"message": "x"})
    result = await scheduler(pool, transport).run_round()
    assert result == RoundResult(claimed=3, dispatched=1, failed=0, handed_back=2)
    found = rows(conn, ids)
    assert [found[eid]["status"] for eid in ids] == ["scheduled", "requested", "requested"]
    assert found[ids[0]]["worker"] == echo
    assert all(found[eid]["executor"] is None and found[eid]["attempt"] == 0 for eid in ids[1:])
    assert conn.execute("SELECT count(*) AS n FROM execution_attempt").fetchone()["n"] == 1


async def test_stale_worker_gets_nothing(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    stale = add_worker(conn, "w-stale", heartbeat="now() - interval '1 hour'")
    fresh = add_worker(conn, "w-fresh")
    add_worker(conn, "w-never")  # registered, heartbeat NULL below
    conn.execute("UPDATE worker SET last_heartbeat = NULL WHERE name = 'w-never'")
    add_worker(conn, "w-draining", status="draining")
    add_worker(conn, "w-inactive", status="inactive")
    ids = request(conn, 4)
    assert (await scheduler(pool, transport).run_round()).dispatched == 4
    assert {r["worker"] for r in rows(conn, ids).values()} == {fresh}
    assert loads(conn)[stale] == 0


async def test_only_stale_workers_means_no_workers(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    add_worker(conn, "w-stale", heartbeat="now() - interval '1 hour'")
    ids = request(conn, 2)
    result = await scheduler(pool, transport).run_round()
    assert result == RoundResult(claimed=2, dispatched=0, failed=2, handed_back=0)
    assert {r["status"] for r in rows(conn, ids).values()} == {"failed"}


async def test_no_live_worker_fails_executions(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    ids = request(conn, 3, "core.echo", {"message": "x"})
    result = await scheduler(pool, transport).run_round()
    assert result == RoundResult(claimed=3, dispatched=0, failed=3, handed_back=0)
    for row in rows(conn, ids).values():
        assert row["status"] == "failed"
        assert "no workers available" in row["result"]["error"]
        assert "core.echo" in row["result"]["error"]
        assert row["result"]["succeeded"] is False
        assert row["result"]["failed_by"] == "scheduler"
        assert row["ended"] is not None
        assert row["attempt"] == 0


async def test_no_capable_worker_fails_executions(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    add_worker(conn, "w-noop-only", actions="{core.noop}")
    [eid] = request(conn, 1, "core.sleep", {"seconds": 1})
    assert (await scheduler(pool, transport).run_round()).failed == 1
    assert "no workers available" in rows(conn, [eid])[eid]["result"]["error"]


async def test_no_worker_grace_keeps_executions_requested(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    ids = request(conn, 3)
    s = scheduler(pool, transport, no_worker_grace=60)
    for _ in range(2):
        result = await s.run_round()
        assert result.dispatched == 0
        assert result.failed == 0
    assert {(r["status"], r["executor"]) for r in rows(conn, ids).values()} == {("requested", None)}
    # Past the grace period an execution nobody can run is failed; the others still wait.
    conn.execute("UPDATE execution SET created = now() - interval '2 minutes' WHERE id = %s", (ids[0],))
    result = await s.run_round()
    assert result.failed == 1
    assert result.dispatched == 0
    found = rows(conn, ids)
    assert found[ids[0]]["status"] == "failed"
    assert "no workers available" in found[ids[0]]["result"]["error"]
    assert {(found[eid]["status"], found[eid]["executor"]) for eid in ids[1:]} == {("requested", None)}
    # A worker arrives within the grace period: the rest run.
    w = add_worker(conn, "w-late")
    assert (await s.run_round()).dispatched == 2
    assert {rows(conn, ids)[eid]["worker"] for eid in ids[1:]} == {w}


async def test_no_worker_grace_with_a_live_but_incapable_worker(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    add_worker(conn, "w-noop-only", actions="{core.noop}")
    ids = request(conn, 2, "core.echo", {"message": "x"})
    s = scheduler(pool, transport, no_worker_grace=60)
    result = await s.run_round()
    assert result.failed == 0
    assert result.dispatched == 0
    assert {(r["status"], r["executor"]) for r in rows(conn, ids).values()} == {("requested", None)}


async def test_invalid_parameters_inserted_directly_are_failed(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    w = add_worker(conn, "w1")
    bad = [
        int(
            conn.execute(
                "INSERT INTO execution (action_ref, parameters) VALUES (%s, %s) RETURNING id", (ref, Jsonb(params))
            ).fetchone()["id"]
        )
        for ref, params in [
            ("core.echo", {}),
            ("core.echo", {"message": 5}),
            ("core.sleep", {"seconds": -1}),
            ("core.noop", {"x": 1}),
        ]
    ]
    good = request(conn, 1, "core.echo", {"message": "ok"})
    result = await scheduler(pool, transport).run_round()
    assert result == RoundResult(claimed=5, dispatched=1, failed=4, handed_back=0)
    found = rows(conn, bad + good)
    for eid in bad:
        assert found[eid]["status"] == "failed"
        assert found[eid]["result"]["error"].startswith("invalid parameters: ")
        assert found[eid]["worker"] is None
    assert "'message' is a required property" in found[bad[0]]["result"]["error"]
    assert "message: 5 is not of type 'string'" in found[bad[1]]["result"]["error"]
    assert "seconds: -1 is less than the minimum of 0" in found[bad[2]]["result"]["error"]
    assert found[good[0]]["status"] == "scheduled"
    assert found[good[0]]["worker"] == w


async def test_batch_size_limits_a_round(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    add_worker(conn, "w1", capacity=50)
    request(conn, 7)
    s = scheduler(pool, transport, batch_size=3)
    assert [(await s.run_round()).dispatched for _ in range(4)] == [3, 3, 1, 0]


async def test_a_full_worker_does_not_starve_other_actions(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    add_worker(conn, "w-echo", capacity=1, actions="{core.echo}")
    noop_worker = add_worker(conn, "w-noop", capacity=3, actions="{core.noop}")
    request(conn, 10, "core.echo", {"message": "x"})
    noops = request(conn, 2, "core.noop")
    s = scheduler(pool, transport)
    for _ in range(5):
        await s.run_round()
    assert {r["worker"] for r in rows(conn, noops).values()} == {noop_worker}


# ---------------------------------------------------------------------------
# Stale claims
# ---------------------------------------------------------------------------


def _age_updated(conn: Conn, ids: list[int], interval: str = "1 hour") -> None:
    with conn.transaction():
        conn.execute("ALTER TABLE execution DISABLE TRIGGER execution_guard")
        conn.execute(f"UPDATE execution SET updated = now() - interval '{interval}' WHERE id = ANY(%s)", (ids,))
        conn.execute("ALTER TABLE execution ENABLE TRIGGER execution_guard")


async def test_stale_scheduling_claim_is_reclaimed(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    stale, fresh = request(conn, 2)
    conn.execute(
        "UPDATE execution SET status = 'scheduling', executor = 'ex-dead' WHERE id = ANY(%s)", ([stale, fresh],)
    )
    _age_updated(conn, [stale])
    s = scheduler(pool, transport)
    assert await s.reclaim_stale(older_than=30) == 1
    found = rows(conn, [stale, fresh])
    assert (found[stale]["status"], found[stale]["executor"]) == ("requested", None)
    assert (found[fresh]["status"], found[fresh]["executor"]) == ("scheduling", "ex-dead")
    assert await s.reclaim_stale(older_than=30) == 0

    # The reclaimed execution is dispatched by a live executor ...
    w = add_worker(conn, "w1")
    assert (await s.run_round()).dispatched == 1
    assert rows(conn, [stale])[stale]["worker"] == w
    # ... and the dead executor's late assignment of its other claim's sibling changes nothing.
    late = conn.execute(Q["assign"], {"ids": [stale], "workers": [w], "executor": "ex-dead"}).fetchall()
    assert late == []
    assert rows(conn, [stale])[stale]["attempt"] == 1
    assert (
        conn.execute("SELECT count(*) AS n FROM execution_attempt WHERE execution = %s", (stale,)).fetchone()["n"] == 1
    )


# ---------------------------------------------------------------------------
# Concurrent executors
# ---------------------------------------------------------------------------


async def test_concurrent_schedulers_never_double_dispatch(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    capacity = {add_worker(conn, "wa", capacity=3): 3, add_worker(conn, "wb", capacity=4): 4}
    total = 60
    ids = request(conn, total)
    a = scheduler(pool, transport, executor_id="ex-a", batch_size=5)
    b = scheduler(pool, transport, executor_id="ex-b", batch_size=5)
    dispatched = 0
    for _ in range(200):
        results = await asyncio.gather(a.run_round(), b.run_round(), a.run_round(), b.run_round())
        dispatched += sum(r.dispatched for r in results)
        assert sum(r.failed for r in results) == 0
        current = loads(conn)
        for worker, load in current.items():
            assert load <= capacity[worker], f"worker {worker} holds {load} > capacity {capacity[worker]}"
        # The workers run what they were given and free their slots.
        for worker in capacity:
            started = claim(conn, worker)
            done = finish_all(conn, worker, [(r["id"], r["attempt"]) for r in started])
            assert sorted(done) == sorted(r["id"] for r in started)
        if statuses(conn).get("completed") == total:
            break
    found = rows(conn, ids)
    assert {r["status"] for r in found.values()} == {"completed"}
    assert {r["attempt"] for r in found.values()} == {1}
    assert dispatched == total
    per_execution = conn.execute("SELECT execution, count(*) AS n FROM execution_attempt GROUP BY execution").fetchall()
    assert len(per_execution) == total
    assert {r["n"] for r in per_execution} == {1}
    assert {r["executor"] for r in found.values()} <= {"ex-a", "ex-b"}
