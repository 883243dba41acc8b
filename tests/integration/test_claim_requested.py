"""claim_requested, the executor's claim of worker-run executions, against the real
database: which rows (what a live worker can run, now, not held by admission or by another
replica), in which order (oldest first across actions), and at what cost behind a burst of
requests the planner's statistics have not caught up with."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.sdk import request_executions
from conveyor.store.queries import Q
from integration.builders import Conn, request


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


def statuses(conn: Conn, ids: list[int]) -> list[str]:
    found = {r["id"]: r["status"] for r in conn.execute(
        "SELECT id, status FROM execution WHERE id = ANY(%s)", (ids,)).fetchall()}  # fmt: skip
    return [found[i] for i in ids]


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
    assert statuses(conn, order) == ["scheduling"] * 3 + ["requested"] * 2 + ["scheduling"]


def test_rows_delayed_or_held_by_another_replica_are_skipped(db_url: str, conn: Conn) -> None:
    first, second, third = request(conn, 3, "core.noop")
    conn.execute("UPDATE execution SET not_before = now() + interval '1 hour' WHERE id = %s", (second,))
    with psycopg.connect(db_url) as other:
        other.execute("SELECT id FROM conveyor.execution WHERE id = %s FOR UPDATE", (first,))  # a replica's claim
        assert claim(conn, 10, ["core.noop"]) == [third]
    assert statuses(conn, [first, second, third]) == ["requested", "requested", "scheduling"]
    assert claim(conn, 10, ["core.noop"]) == [first]


def test_a_burst_the_statistics_have_not_seen_costs_no_more_than_a_few_rows(conn: Conn) -> None:
    """The claim runs every round. Joined to action in one scan, its plan followed the
    statistics of status: a burst of requests not yet analyzed was estimated at a row or
    two, and every round hashed and sorted the whole backlog (3.6 ms a round behind 3,000
    core.noop, the largest cost of an execution at a small concurrency). It must reach the
    oldest few through the index whatever the statistics say."""
    conn.execute("ANALYZE execution")  # statistics of an empty table, as after a quiet spell
    with conn.transaction():
        request_executions(conn, [("core.noop", {})] * 3000)
    echo = request(conn, 1, "core.echo", {"message": "m"})[0]
    params = {"limit": 4, "executor": "ex", "refs": ["core.noop", "core.echo"], "runtimes": ["shell"]}
    with conn.transaction():
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q["claim_requested"], params).fetchone()
        raise psycopg.Rollback()  # the EXPLAIN claimed them: undone
    assert plan is not None
    read = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) + n.get("Rows Removed by Filter", 0)
               for n in _nodes(plan["QUERY PLAN"][0]["Plan"]) if n.get("Relation Name") == "execution")  # fmt: skip
    assert read < 100, f"{read} execution rows read to claim 4"
    first = conn.execute("SELECT min(id) AS id FROM execution").fetchone()["id"]
    assert claim(conn, 4, ["core.noop", "core.echo"]) == [first, first + 1, first + 2, first + 3]
    assert echo > first + 3


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]
