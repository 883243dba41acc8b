"""finish, the worker's result write, against the real database: a batch costs work in
proportion to its results, whatever the planner's statistics say about running rows (they
never describe them: taken when there were none, or when all had ended)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg

from conveyor.sdk import request_executions
from conveyor.store.queries import Q
from integration.builders import Conn, add_worker, claim, finish_all, rows

BATCH = 400


def running(conn: Conn, worker: int, n: int) -> list[tuple[int, int]]:
    """``n`` executions running on ``worker``, through the executor's and worker's own
    queries."""
    ids = request_executions(conn, [("core.noop", {})] * n)
    claimed = conn.execute(Q["claim_requested"], {"limit": n, "executor": "ex", "refs": ["core.noop"], "runtimes": []})
    picked = [r["id"] for r in claimed.fetchall()]
    conn.execute(Q["assign"], {"ids": picked, "workers": [worker] * len(picked), "executor": "ex"})
    started = [(r["id"], r["attempt"]) for r in claim(conn, worker, limit=n)]
    assert sorted(i for i, _ in started) == sorted(ids)
    return started


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def work(plan: dict[str, Any]) -> int:
    """Rows every node of an executed plan produced or threw away, over all its loops: a
    measure of the plan's shape that does not depend on the machine's speed."""
    return sum(
        round((n["Actual Rows"] + n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Join Filter", 0))
              * n["Actual Loops"])
        for n in nodes(plan)
    )  # fmt: skip


def test_a_batch_of_results_costs_in_proportion_to_its_size(conn: Conn) -> None:
    """Planned from statistics that believed one running row, the query nested a scan of
    the worker's running rows (or of the table) inside the loop over its results: 75 ms for
    a batch of 500 on a table of 10,000, growing with the square of the batch (160,000 rows
    thrown away by its join filter for a batch of 400). Every statement it runs, nested ones
    included, is planned and measured here through auto_explain."""
    worker = add_worker(conn, "w", capacity=BATCH)
    finish_all(conn, worker, running(conn, worker, 1000))  # a history, which no ANALYZE has seen
    batch = running(conn, worker, BATCH)
    plans: list[dict[str, Any]] = []

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if "plan:" in message:
            plans.append(json.loads(message.split("plan:", 1)[1])["Plan"])

    conn.execute("LOAD 'auto_explain'")
    for setting, value in (("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_analyze", "on"),
                           ("log_timing", "off"), ("log_format", "json"), ("log_level", "notice")):  # fmt: skip
        conn.execute(f"SET auto_explain.{setting} = {value}")
    conn.execute("SET client_min_messages = notice")
    conn.add_notice_handler(collect)
    try:
        written = finish_all(conn, worker, batch)
    finally:
        conn.remove_notice_handler(collect)
        conn.execute("SET auto_explain.log_min_duration = -1")
    assert sorted(written) == sorted(i for i, _ in batch)
    assert {r["status"] for r in rows(conn, written).values()} == {"completed"}
    assert plans, "auto_explain reported no plan"
    worst = max(work(p) for p in plans)
    assert worst <= 20 * BATCH, f"one statement of finish did {worst} rows of work for {BATCH} results"
