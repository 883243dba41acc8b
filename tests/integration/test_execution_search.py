"""The executions list's searches (issue #15) on a table of 200,000 executions: a
parameters or error search is a backward range scan of the primary key over its id
window (at most ``search.SCAN`` rows, matches or not), never a scan of the table, and the
window's floor is where the next page goes on. Plans are read with EXPLAIN (and EXPLAIN
ANALYZE for the rows actually examined)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.api import search
from conveyor.store.queries import Q

Conn = psycopg.Connection[dict[str, Any]]
ROWS = 200_000


def _fill(conn: Conn) -> None:
    # Straight into the table (as history would be; triggers off, as builders.finished does:
    # the guarded path only inserts requested rows): every tenth failed with an error, a
    # result with some output besides (the searches read the result's error key only).
    conn.execute("SET session_replication_role = replica")
    conn.execute("""
        INSERT INTO execution (action_ref, parameters, status, result, attempt, created, updated, ended)
        SELECT 'core.echo', jsonb_build_object('message', 'm' || (n %% 1000), 'host', 'h' || (n %% 7)),
               CASE WHEN n %% 10 = 0 THEN 'failed' ELSE 'completed' END,
               CASE WHEN n %% 10 = 0
                    THEN jsonb_build_object('error', 'disk full on h' || (n %% 7), 'stdout', repeat('x', 200))
                    ELSE jsonb_build_object('succeeded', true) END,
               1, now() - make_interval(secs => 200000 - n), now(), now()
        FROM generate_series(1, %s) n
    """, (ROWS,))  # fmt: skip
    conn.execute("RESET session_replication_role")
    conn.execute("ANALYZE execution")


def _params(**changes: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"statuses": None, "action": None, "worker": None, "since": None, "until": None,
                              "before": None, "limit": 50, "with_result": False, "parameters": None,
                              "error": None, "floor": None}  # fmt: skip
    params.update(changes)
    if isinstance(params["parameters"], dict):
        params["parameters"] = Jsonb(params["parameters"])
    return params


def _plan(conn: Conn, params: dict[str, Any], analyze: bool = False) -> dict[str, Any]:
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    row = conn.execute(f"EXPLAIN ({options}) {Q['api_list_executions']}", params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    plan = row["QUERY PLAN"]
    return dict((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def _scan_of_execution(plan: dict[str, Any]) -> dict[str, Any]:
    scans = [n for n in _nodes(plan) if n.get("Relation Name") == "execution"]
    assert len(scans) == 1, scans
    return scans[0]


def test_searches_scan_only_their_window_of_the_primary_key(conn: Conn) -> None:
    _fill(conn)
    top = conn.execute(Q["execution_top_id"]).fetchone()
    assert top is not None
    floor = max(int(top["top"]) - search.SCAN, 1)
    for wanted in [
        {"parameters": {"message": "m-none"}},  # matches nothing: the worst case, still the window only
        {"parameters": {"host": "h3"}},
        {"error": "no such text"},
        {"error": "DISK FULL on h2"},
        {"parameters": {"host": "h3"}, "error": "disk", "statuses": ["failed"]},
    ]:
        params = _params(floor=floor, **wanted)
        scan = _scan_of_execution(_plan(conn, params))
        # The window is an index condition on the primary key: a backward index scan, or
        # (with a status filter, when the planner finds it cheaper) a bitmap of the
        # window ANDed with the status index. Either way no heap row outside the window is read.
        window = [n for n in _nodes(scan) if n.get("Index Name") == "execution_pkey" and "id >=" in n["Index Cond"]]
        assert window, (wanted, scan)
        assert scan["Node Type"] in ("Index Scan", "Bitmap Heap Scan"), (wanted, scan)
        done = _scan_of_execution(_plan(conn, params, analyze=True))
        examined = done["Actual Rows"] + done.get("Rows Removed by Filter", 0)
        assert examined <= search.SCAN, (wanted, done)

    # What the searches find is right: the newest matches, within the window.
    rows = conn.execute(Q["api_list_executions"], _params(floor=floor, error="disk full on h2", limit=5)).fetchall()
    assert len(rows) == 5
    assert all(r["status"] == "failed" and r["error_head"].startswith("disk full on h2") for r in rows)
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    none = conn.execute(Q["api_list_executions"], _params(floor=floor, parameters={"message": "m-none"})).fetchall()
    assert none == []


def test_without_a_search_the_list_stays_a_short_walk_of_the_primary_key(conn: Conn) -> None:
    _fill(conn)
    done = _scan_of_execution(_plan(conn, _params(), analyze=True))
    assert done["Index Name"] == "execution_pkey", done
    assert done["Actual Rows"] <= 50, done
    # A time range alone: an index (created or the primary key), never the whole table.
    timed = _params(since=conn.execute("SELECT now() - interval '1 hour' AS t").fetchone()["t"])  # type: ignore[index]
    scan = _scan_of_execution(_plan(conn, timed))
    assert scan["Node Type"] in ("Index Scan", "Bitmap Heap Scan"), scan
