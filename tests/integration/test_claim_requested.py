"""claim_requested, the executor's claim of worker-run executions, against the real
database: which rows (what a live worker can run, now, not held by admission or by another
replica), in which order (oldest first across actions), and at what cost behind a burst of
requests the planner's statistics have not caught up with."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conveyor.sdk import request_executions
from conveyor.store.queries import Q
from integration.builders import Conn, request, status


def claim(conn: Conn, limit: int, refs: list[str], runtimes: list[str] | None = None) -> list[int]:
    params = {"limit": limit, "executor": "ex", "refs": refs, "runtimes": runtimes or []}
    return [r["id"] for r in conn.execute(Q["claim_requested"], params).fetchall()]


def shell_action(conn: Conn, ref: str = "test.shell", runtime: str = "shell") -> str:
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema) "
        "VALUES (%s, 'test', %s, 'subprocess', %s, %s)",
        (ref, ref.split(".")[-1], runtime, Jsonb({"type": "object"})),
    )
    return ref


def test_oldest_first_across_every_action_a_worker_can_run(conn: Conn) -> None:
    shell = shell_action(conn)
    other = shell_action(conn, "test.ruby", runtime="ruby")
    order = [
        request(conn, 1, "core.noop")[0],
        request(conn, 1, shell)[0],  # claimable through the runtime, not the ref
        request(conn, 1, "core.echo", {"message": "m"})[0],
        request(conn, 1, "core.sleep", {"seconds": 0})[0],  # no worker offers it
        request(conn, 1, other)[0],  # nor this runtime
        request(conn, 1, "core.noop")[0],
    ]
    assert claim(conn, 3, ["core.noop", "core.echo"], ["shell"]) == order[:3]
    assert claim(conn, 10, ["core.noop", "core.echo"], ["shell"]) == [order[5]]
    assert [status(conn, i) for i in order] == ["scheduling"] * 3 + ["requested"] * 2 + ["scheduling"]


def test_rows_delayed_or_held_by_another_replica_are_skipped(db_url: str, conn: Conn) -> None:
    first, second, third = request(conn, 3, "core.noop")
    conn.execute("UPDATE execution SET not_before = now() + interval '1 hour' WHERE id = %s", (second,))
    with psycopg.connect(db_url) as other:
        other.execute("SELECT id FROM conveyor.execution WHERE id = %s FOR UPDATE", (first,))  # a replica's claim
        assert claim(conn, 10, ["core.noop"]) == [third]
    assert [status(conn, i) for i in (first, second, third)] == ["requested", "requested", "scheduling"]
    assert claim(conn, 10, ["core.noop"]) == [first]


@pytest.mark.parametrize("statistics", ["fresh table", "long history"])
def test_a_claim_costs_the_rows_it_takes_not_the_backlog(conn: Conn, statistics: str) -> None:
    """Both claims run every round, so each must cost the few rows it takes however long
    the backlog behind them, whatever the planner's statistics say. They never say anything
    useful about requested rows: none at the last ANALYZE of a fresh table, then a burst
    that autovacuum has not yet seen (the claim hashed and sorted the whole backlog: 3.6 ms
    a round behind 3,000); or a handful among millions of finished rows (a planner
    expecting one row walked the backlog for every candidate: 9 s a round behind 20,000 on
    a 10M-row history). Measured in buffers touched, which do not depend on the machine's
    speed: a backlog six times as long must not cost more."""
    if statistics == "long history":  # finished rows, inserted as the history benchmark's COPY does
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")  # no triggers: not the guarded path
            conn.execute("INSERT INTO execution (action_ref, status, attempt, ended) "
                         "SELECT 'core.noop', 'completed', 1, now() FROM generate_series(1, 20000)")  # fmt: skip
    conn.execute("ANALYZE execution")
    request_executions(conn, [("core.noop", {})] * 1000)
    ask = request(conn, 1, "core.ask", {"prompt": "ok?"})[0]
    short = cost(conn, "claim_requested"), cost(conn, "pick_executor_run")
    with conn.transaction():
        request_executions(conn, [("core.noop", {})] * 5000)
    long = cost(conn, "claim_requested"), cost(conn, "pick_executor_run")
    for query, before, after in zip(("claim_requested", "pick_executor_run"), short, long, strict=True):
        assert after <= before * 1.5 + 20, f"{query}: {before} buffers behind 1,000, {after} behind 6,000"
    first = conn.execute("SELECT min(id) AS id FROM execution WHERE status = 'requested'").fetchone()["id"]
    assert claim(conn, 4, ["core.noop", "core.echo"]) == [first, first + 1, first + 2, first + 3]
    assert [r["id"] for r in conn.execute(Q["pick_executor_run"], {"limit": 500}).fetchall()] == [ask]


def cost(conn: Conn, query: str) -> int:
    """Shared buffers one run of ``query`` touches (rolled back), as EXPLAIN counts them."""
    params = {"limit": 4, "executor": "ex", "refs": ["core.noop", "core.echo"], "runtimes": ["shell"]}
    with conn.transaction():
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + Q[query], params).fetchone()
        raise psycopg.Rollback()  # what the EXPLAIN claimed: undone
    assert plan is not None
    top = plan["QUERY PLAN"][0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])
