"""The charts' queries (charts.sql) on the real database: minute buckets on the database
clock, what each counts, and that the finished history does not make them slower (the
execution table holds millions of rows: every scan is a range of an index)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from conveyor.api.dashboard.chart_pages import chart_values
from conveyor.store.db import connect
from conveyor.store.queries import Q

Conn = psycopg.Connection[dict[str, Any]]
CHART_QUERIES = ["chart_finished_by_minute", "chart_latency_by_minute", "chart_queue_depth"]


def insert(conn: Conn, rows: str) -> None:
    """Rows as a SELECT of (action_ref, status, created, updated, started, ended), with
    their first attempt when started: written as they are, past the guard trigger, which
    would stamp now() on them (as the history benchmark's COPY does)."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "INSERT INTO execution (action_ref, status, attempt, created, updated, started, ended) "
            "SELECT action_ref, status, 1, created, updated, started, ended "
            f"FROM ({rows}) r(action_ref, status, created, updated, started, ended)"
        )
        conn.execute(
            "INSERT INTO execution_attempt (execution, attempt, worker_name, scheduled, started, ended) "
            "SELECT id, 1, 'w1', started, started, ended FROM execution e WHERE started IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM execution_attempt t WHERE t.execution = e.id)"
        )


def by_minute(conn: Conn, query: str) -> dict[int, dict[str, Any]]:
    """Buckets keyed by minutes before the database's current minute (0: this one)."""
    rows = conn.execute(Q[query]).fetchall()
    now = conn.execute("SELECT date_trunc('minute', now()) AS m").fetchone()
    assert now is not None
    return {int((now["m"] - r["minute"]).total_seconds() // 60): r for r in rows}


def test_finished_per_minute_counts_completed_and_failed_by_end_on_the_database_clock(conn: Conn) -> None:
    with conn.transaction():  # one now() for the rows and the reading: no minute turns in between
        insert(conn, """
            SELECT 'core.echo', s, m - interval '1 minute', m + interval '10 seconds', m, m + interval '10 seconds'
            FROM (SELECT date_trunc('minute', now()) - interval '5 minutes' AS m) t,
                 unnest(ARRAY['completed', 'completed', 'completed', 'failed', 'timeout', 'abandoned',
                              'cancelled']) AS s
            UNION ALL  -- this minute
            SELECT 'core.echo', 'completed', now(), now(), now(), now()
            UNION ALL  -- finished 61 minutes ago: before the window
            SELECT 'core.echo', 'completed', now() - interval '62 minutes', now() - interval '61 minutes',
                   now() - interval '62 minutes', now() - interval '61 minutes'
            UNION ALL  -- running: not finished
            SELECT 'core.echo', 'running', now(), now(), now(), NULL
        """)  # fmt: skip
        buckets = by_minute(conn, "chart_finished_by_minute")
        at = conn.execute("SELECT now() AS now").fetchone()
    assert sorted(buckets) == list(range(60))  # every minute of the hour, empty ones too
    assert {k: (r["completed"], r["failed"]) for k, r in buckets.items() if r["completed"] or r["failed"]} == {
        5: (3, 3),  # failed, timeout and abandoned are failures; cancelled is not counted
        0: (1, 0),
    }
    assert at is not None
    assert all(r["at"] == at["now"] for r in buckets.values())  # the database's clock, not the API's


def test_latency_per_minute_is_first_start_minus_request(conn: Conn) -> None:
    with conn.transaction():
        insert(conn, """
            SELECT 'core.echo', 'completed', m - make_interval(secs => d), m + interval '30 seconds', m,
                   m + interval '30 seconds'
            FROM (SELECT date_trunc('minute', now()) - interval '3 minutes' + interval '5 seconds' AS m) t,
                 unnest(ARRAY[1, 2, 3, 4, 10]::float8[]) AS d
            UNION ALL  -- started two hours ago: outside the window
            SELECT 'core.echo', 'completed', now() - interval '2 hours', now() - interval '2 hours',
                   now() - interval '2 hours', now() - interval '2 hours'
            UNION ALL  -- not started yet: no latency
            SELECT 'core.echo', 'requested', now(), now(), NULL, NULL
        """)  # fmt: skip
        buckets = by_minute(conn, "chart_latency_by_minute")
    assert sorted(buckets) == list(range(60))
    assert sum(r["samples"] for r in buckets.values()) == 5
    three = buckets[3]
    assert three["samples"] == 5
    assert three["p50"] == pytest.approx(3.0)
    assert three["p95"] == pytest.approx(4 + 0.8 * 6)  # percentile_cont: between 4 and 10
    assert buckets[0]["p50"] is None


def test_queue_depth_counts_waiting_executions_per_action(conn: Conn) -> None:
    insert(conn, """
        SELECT a, s, now(), now(), NULL::timestamptz, NULL::timestamptz
        FROM unnest(ARRAY['core.echo', 'core.echo', 'core.echo', 'core.noop', 'core.noop', 'core.sleep'],
                    ARRAY['requested', 'requested', 'scheduled', 'scheduled', 'scheduled', 'running']) AS x(a, s)
        UNION ALL
        SELECT 'core.sleep', 'completed', now(), now(), now(), now()
    """)  # fmt: skip
    rows = conn.execute(Q["chart_queue_depth"], {"limit": 10}).fetchall()
    assert [(r["action_ref"], r["requested"], r["scheduled"]) for r in rows] == [
        ("core.echo", 2, 1),
        ("core.noop", 0, 2),
    ]
    assert [r["action_ref"] for r in conn.execute(Q["chart_queue_depth"], {"limit": 1}).fetchall()] == ["core.echo"]


async def test_the_page_values_draw_what_the_queries_read(db_url: str) -> None:
    async with await connect(db_url, "conveyor", autocommit=True) as aconn:
        values = await chart_values(aconn)
    assert {"throughput", "failures", "latency", "queue"} <= set(values)
    assert 'id="chart-queue"' in values["queue"]
    assert "nothing waiting" in values["queue"]
    assert (values["completed"], values["failed"], values["samples"]) == (0, 0, 0)


def plan_of(conn: Conn, query: str) -> dict[str, Any]:
    row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + Q[query], {"limit": 16}).fetchone()
    assert row is not None
    return dict(row["QUERY PLAN"][0]["Plan"])


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


def history(conn: Conn, n: int) -> None:
    """``n`` executions that finished two days ago, with their attempts."""
    insert(conn, f"""
        SELECT 'core.echo', CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'completed' END,
               now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
               now() - interval '2 days'
        FROM generate_series(1, {int(n)}) AS i
    """)  # fmt: skip
    conn.execute("ANALYZE execution")
    conn.execute("ANALYZE execution_attempt")


def test_the_chart_queries_read_index_ranges_not_the_finished_history(conn: Conn) -> None:
    """What a poll costs must not grow with the history (10 M rows in production): no
    sequential scan of execution or execution_attempt, and the buffers one run touches stay
    the same when the history grows fivefold."""
    insert(conn, """
        SELECT 'core.echo', 'completed', now() - interval '10 minutes', now() - interval '9 minutes',
               now() - interval '10 minutes', now() - interval '9 minutes' FROM generate_series(1, 50)
        UNION ALL
        SELECT 'core.echo', 'requested', now(), now(), NULL, NULL FROM generate_series(1, 20)
    """)  # fmt: skip
    history(conn, 4_000)
    before = {q: plan_of(conn, q) for q in CHART_QUERIES}
    history(conn, 16_000)
    after = {q: plan_of(conn, q) for q in CHART_QUERIES}
    for query in CHART_QUERIES:
        scans = [(n["Node Type"], n.get("Relation Name")) for n in nodes(before[query]) + nodes(after[query])]
        assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in ("execution", "execution_attempt")], (
            query, scans)  # fmt: skip
        cost = [int(p["Shared Hit Blocks"] + p["Shared Read Blocks"]) for p in (before[query], after[query])]
        assert cost[1] <= cost[0] * 1.2 + 10, (
            f"{query}: {cost[0]} buffers behind 4,000 finished, {cost[1]} behind 20,000"
        )
