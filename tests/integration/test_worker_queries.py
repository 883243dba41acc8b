"""The worker-side fenced queries against the real database, without starting any
process: a worker claims only its own executions, and its results are fenced by worker
and attempt."""

from __future__ import annotations

from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, Pool, add_worker, claim, finish_all, request, rows, scheduler

# ---------------------------------------------------------------------------
# Worker-side fenced queries
# ---------------------------------------------------------------------------


async def test_claim_scheduled_only_returns_this_workers_executions(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    a = add_worker(conn, "wa")
    b = add_worker(conn, "wb")
    request(conn, 4)
    await scheduler(pool, transport).run_round()
    mine = {eid for eid, r in rows(conn).items() if r["worker"] == a}
    got = claim(conn, a)
    assert {r["id"] for r in got} == mine
    assert all(r["attempt"] == 1 and r["action_ref"] == "core.noop" and r["runner_type"] == "python" for r in got)
    found = rows(conn)
    assert {found[eid]["status"] for eid in mine} == {"running"}
    assert {r["status"] for r in found.values() if r["worker"] == b} == {"scheduled"}
    assert claim(conn, a) == []  # already running: not claimed twice
    started = conn.execute("SELECT execution, started FROM execution_attempt WHERE worker = %s", (a,)).fetchall()
    assert all(r["started"] is not None for r in started)


async def test_finish_is_fenced_by_worker_and_attempt(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    a = add_worker(conn, "wa")
    b = add_worker(conn, "wb", heartbeat="now() - interval '1 hour'")
    [eid] = request(conn)
    s = scheduler(pool, transport)
    await s.run_round()
    [running] = claim(conn, a)
    assert running["attempt"] == 1

    before = rows(conn, [eid])[eid]
    assert finish_all(conn, a, [(eid, 2)]) == []  # wrong attempt
    assert finish_all(conn, b, [(eid, 1)]) == []  # wrong worker
    assert rows(conn, [eid])[eid] == before
    assert before["status"] == "running"

    # The run is lost (recovery puts it back), and it is dispatched again to b.
    conn.execute("UPDATE execution SET status = 'requested', worker = NULL, executor = NULL WHERE id = %s", (eid,))
    conn.execute("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (a,))
    conn.execute("UPDATE worker SET last_heartbeat = now() WHERE id = %s", (b,))
    await s.run_round()
    [again] = claim(conn, b)
    assert again["attempt"] == 2
    # The old attempt's late result is refused ...
    assert finish_all(conn, a, [(eid, 1)], status="failed", error="late") == []
    assert rows(conn, [eid])[eid]["status"] == "running"
    # ... the current one is recorded.
    assert finish_all(conn, b, [(eid, 2)]) == [eid]
    row = rows(conn, [eid])[eid]
    assert row["status"] == "completed"
    assert row["result"] == {"succeeded": True, "error": None}
    assert row["ended"] is not None
    attempts = conn.execute("SELECT * FROM execution_attempt WHERE execution = %s ORDER BY attempt", (eid,)).fetchall()
    assert [(t["attempt"], t["worker_name"], t["outcome"]) for t in attempts] == [
        (1, "wa", None),
        (2, "wb", "completed"),
    ]
    assert attempts[1]["ended"] == row["ended"]
    # Finishing twice changes nothing.
    assert finish_all(conn, b, [(eid, 2)], status="failed") == []
    assert rows(conn, [eid])[eid]["status"] == "completed"


async def test_finish_records_failure_outcome(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    w = add_worker(conn, "w1")
    ids = request(conn, 2)
    await scheduler(pool, transport).run_round()
    started = claim(conn, w)
    done = [(r["id"], r["attempt"]) for r in started]
    assert sorted(finish_all(conn, w, done[:1], status="failed", error="boom")) == [done[0][0]]
    assert finish_all(conn, w, done[1:], status="timeout", error="took too long") == [done[1][0]]
    found = rows(conn, ids)
    assert found[done[0][0]]["status"] == "failed"
    assert found[done[1][0]]["status"] == "timeout"
    outcomes = {
        r["execution"]: (r["outcome"], r["error"]) for r in conn.execute("SELECT * FROM execution_attempt").fetchall()
    }
    assert outcomes == {done[0][0]: ("failed", "boom"), done[1][0]: ("timeout", "took too long")}
