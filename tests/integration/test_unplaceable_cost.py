"""claim_unplaceable, which every executor runs every round to fail what no live worker can
run, against the real database: its cost follows the executions of the actions nobody
offers, not the backlog of those that wait for a free slot."""

from __future__ import annotations

import json
from typing import Any

from conveyor.sdk import request_executions
from conveyor.store.queries import Q
from integration.builders import Conn
from integration.test_finish_cost import nodes, work

BACKLOG = 20_000
ORPHANS = 30


def test_the_unplaceable_are_found_without_reading_the_backlog(conn: Conn) -> None:
    """The query used to filter every requested row for the rare unplaceable one: a
    sequential scan of the table each round (14 ms per 100,000 waiting, 36 ms under load),
    to find nothing at all most of the time."""
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema)"
        " VALUES ('gone.away', 'gone', 'away', 'python', 'python', '{}')"
    )
    request_executions(conn, [("core.noop", {})] * BACKLOG)
    orphans = request_executions(conn, [("gone.away", {})] * ORPHANS)
    conn.execute("ANALYZE execution")
    params = {"limit": 100, "executor": "ex", "refs": ["core.noop", "core.sleep", "core.echo"], "runtimes": ["shell"]}
    with conn.transaction(force_rollback=True):
        found = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q["claim_unplaceable"], params).fetchone()
        assert found is not None
        plan: dict[str, Any] = (found["QUERY PLAN"] if isinstance(found, dict) else found[0])[0]["Plan"]
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "execution" and n["Node Type"] == "Seq Scan"]
    assert scans == [], json.dumps(plan, indent=1)
    assert work(plan) < 20 * ORPHANS, json.dumps(plan, indent=1)  # proportional to the orphans, not the backlog
    with conn.transaction(force_rollback=True):
        claimed = sorted(r["id"] for r in conn.execute(Q["claim_unplaceable"], params).fetchall())
    assert claimed == sorted(orphans)
