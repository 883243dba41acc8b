"""The schema against a real PostgreSQL: the transition graph the database enforces,
the seeds' runbook SQL, and database-clock timestamps."""

from __future__ import annotations

import itertools
import re
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.errors import CheckViolation
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conveyor.domain.status import TRANSITIONS, ExecutionStatus, can_transition, edges
from integration.builders import Conn, add_worker

S = ExecutionStatus


def _path_to(target: ExecutionStatus) -> list[ExecutionStatus]:
    """Shortest sequence of statuses leading from requested to ``target``."""
    parents: dict[ExecutionStatus, ExecutionStatus | None] = {S.REQUESTED: None}
    queue = deque([S.REQUESTED])
    while queue:
        here = queue.popleft()
        for nxt in sorted(TRANSITIONS[here]):
            if nxt not in parents:
                parents[nxt] = here
                queue.append(nxt)
    path: list[ExecutionStatus] = []
    node: ExecutionStatus | None = target
    while node is not None and node is not S.REQUESTED:
        path.append(node)
        node = parents[node]
    return list(reversed(path))


def new_execution(conn: Conn, status: ExecutionStatus = S.REQUESTED) -> int:
    eid = int(conn.execute("INSERT INTO execution (action_ref) VALUES ('core.noop') RETURNING id").fetchone()["id"])
    for step in _path_to(status):
        conn.execute("UPDATE execution SET status = %s WHERE id = %s", (step, eid))
    return eid


def execution_row(conn: Conn, eid: int) -> dict[str, Any]:
    return conn.execute("SELECT * FROM execution WHERE id = %s", (eid,)).fetchone()


# ---------------------------------------------------------------------------
# The transition graph in the database
# ---------------------------------------------------------------------------


def test_transition_table_equals_the_domain_graph(conn: Conn) -> None:
    rows = conn.execute("SELECT from_status, to_status FROM execution_transition").fetchall()
    assert {(r["from_status"], r["to_status"]) for r in rows} == edges()


def test_status_check_constraint_lists_every_status(conn: Conn) -> None:
    definition = conn.execute(
        "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint "
        "WHERE conrelid = 'execution'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%status%'"
    ).fetchone()["d"]
    assert set(re.findall(r"'(\w+)'::text", definition)) == {s.value for s in ExecutionStatus}


def test_every_pair_of_statuses(conn: Conn) -> None:
    """Exhaustive: from each status, every legal edge succeeds and every other target is refused."""
    for source, target in itertools.permutations(ExecutionStatus, 2):
        eid = new_execution(conn, source)
        before = execution_row(conn, eid)
        assert before["status"] == source
        if can_transition(source, target):
            conn.execute("UPDATE execution SET status = %s WHERE id = %s", (target, eid))
            assert execution_row(conn, eid)["status"] == target
        else:
            with pytest.raises(CheckViolation, match=f"illegal execution transition {source} -> {target}"):
                conn.execute("UPDATE execution SET status = %s WHERE id = %s", (target, eid))
            assert execution_row(conn, eid) == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_guard_property(conn: Conn, data: st.DataObject) -> None:
    eid = new_execution(conn)
    current = S.REQUESTED
    for _ in range(data.draw(st.integers(min_value=1, max_value=12), label="steps")):
        legal = sorted(TRANSITIONS[current])
        # Bias towards legal moves so that walks get deep into the graph.
        if legal and data.draw(st.booleans(), label="legal move"):
            target = data.draw(st.sampled_from(legal), label="target")
        else:
            target = data.draw(st.sampled_from(list(ExecutionStatus)), label="target")
        before = execution_row(conn, eid)
        assert before["status"] == current
        if target == current or can_transition(current, target):
            # A legal edge (or a write that leaves the status as it is) succeeds.
            conn.execute("UPDATE execution SET status = %s WHERE id = %s", (target, eid))
            assert execution_row(conn, eid)["status"] == target
            current = target
        else:
            with pytest.raises(CheckViolation):
                conn.execute("UPDATE execution SET status = %s WHERE id = %s", (target, eid))
            assert execution_row(conn, eid) == before


def test_insert_must_start_in_requested(conn: Conn) -> None:
    for status in ExecutionStatus:
        if status is S.REQUESTED:
            continue
        with pytest.raises(CheckViolation, match=f"an execution starts in requested, not {status}"):
            conn.execute("INSERT INTO execution (action_ref, status) VALUES ('core.noop', %s)", (status,))
        with pytest.raises(CheckViolation):
            conn.execute("INSERT INTO execution (action_ref, status) SELECT 'core.noop', %s", (status,))
        assert conn.execute("SELECT count(*) AS n FROM execution").fetchone()["n"] == 0
    conn.execute("INSERT INTO execution (action_ref, status) VALUES ('core.noop', 'requested')")
    assert conn.execute("SELECT count(*) AS n FROM execution").fetchone()["n"] == 1


# ---------------------------------------------------------------------------
# The seeds' runbook SQL, unchanged
# ---------------------------------------------------------------------------

# ../shared/seeds/003 (heartbeat quick reference), verbatim.
ACTIVE_WORKERS = """SELECT name, worker_role, status, last_heartbeat
FROM worker
WHERE status = 'active'
ORDER BY last_heartbeat DESC;"""
RECENT_DEACTIVATIONS = """SELECT name, worker_role, status, last_heartbeat, updated
FROM worker
WHERE status = 'inactive'
AND updated > NOW() - INTERVAL '5 minutes'
ORDER BY updated DESC;"""
COUNT_BY_STATUS = """SELECT status, COUNT(*)
FROM worker
GROUP BY status;"""
DELETE_OLD_INACTIVE = """-- Delete inactive workers older than 7 days
DELETE FROM worker
WHERE status = 'inactive'
AND updated < NOW() - INTERVAL '7 days';"""
# ../shared/seeds/000 (timeout monitor, graceful shutdown), verbatim, with $n placeholders.
TIMEOUT_MONITOR = """SELECT * FROM execution
WHERE status = 'scheduled'
AND updated < $1"""
FAIL_EXECUTION = """UPDATE execution
SET status = 'failed',
result = $2,
updated = NOW()
WHERE id = $1"""
MARK_INACTIVE = "UPDATE worker SET status = 'inactive', updated = NOW() WHERE id = $1"


def completed_on(conn: Conn, worker_id: int, worker_name: str) -> int:
    """An execution run to completion on a worker, with its attempt row."""
    eid = new_execution(conn)
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 'ex' WHERE id = %s", (eid,))
    conn.execute(
        "UPDATE execution SET status = 'scheduled', worker = %s, attempt = 1, scheduled = now() WHERE id = %s",
        (worker_id, eid),
    )
    conn.execute(
        "INSERT INTO execution_attempt (execution, attempt, worker, worker_name) VALUES (%s, 1, %s, %s)",
        (eid, worker_id, worker_name),
    )
    conn.execute("UPDATE execution SET status = 'running', started = now() WHERE id = %s", (eid,))
    conn.execute("UPDATE execution SET status = 'completed', ended = now() WHERE id = %s", (eid,))
    conn.execute("UPDATE execution_attempt SET ended = now(), outcome = 'completed' WHERE execution = %s", (eid,))
    return eid


def test_runbook_monitoring_queries(conn: Conn) -> None:
    add_worker(conn, "w-fresh")
    add_worker(conn, "w-older-heartbeat", heartbeat="now() - interval '20 seconds'")
    add_worker(conn, "w-draining", status="draining")
    add_worker(conn, "w-old-inactive", status="inactive", updated="now() - interval '8 days'")
    leaving = add_worker(conn, "w-leaving")
    # The seeds' graceful-shutdown statement, run as written ($1 placeholder).
    with psycopg.RawCursor(conn, row_factory=dict_row) as cur:
        cur.execute(MARK_INACTIVE, (leaving,))
        assert cur.rowcount == 1

    active = conn.execute(ACTIVE_WORKERS).fetchall()
    assert [r["name"] for r in active] == ["w-fresh", "w-older-heartbeat"]
    assert all(r["worker_role"] == "action" and r["status"] == "active" for r in active)

    recent = conn.execute(RECENT_DEACTIVATIONS).fetchall()
    assert [r["name"] for r in recent] == ["w-leaving"]

    counts = {r["status"]: r["count"] for r in conn.execute(COUNT_BY_STATUS).fetchall()}
    assert counts == {"active": 2, "draining": 1, "inactive": 2}


def test_runbook_delete_keeps_execution_history(conn: Conn) -> None:
    old = add_worker(conn, "w-old", status="inactive", updated="now() - interval '8 days'")
    recent = add_worker(conn, "w-recent", status="inactive")
    active = add_worker(conn, "w-active", updated="now() - interval '30 days'")
    eid = completed_on(conn, old, "w-old")
    other = completed_on(conn, recent, "w-recent")
    before = execution_row(conn, eid)

    with conn.cursor() as cur:
        cur.execute(DELETE_OLD_INACTIVE)
        assert cur.rowcount == 1
    remaining = {r["id"] for r in conn.execute("SELECT id FROM worker").fetchall()}
    assert remaining == {recent, active}

    after = execution_row(conn, eid)
    assert after["worker"] is None
    assert after["status"] == "completed"
    assert {k: v for k, v in after.items() if k not in ("worker", "updated")} == {
        k: v for k, v in before.items() if k not in ("worker", "updated")
    }
    attempt = conn.execute("SELECT * FROM execution_attempt WHERE execution = %s", (eid,)).fetchone()
    assert attempt["worker"] is None
    assert attempt["worker_name"] == "w-old"
    assert attempt["outcome"] == "completed"
    assert execution_row(conn, other)["worker"] == recent


def test_timeout_monitor_query_and_fail_statement(conn: Conn) -> None:
    w = add_worker(conn, "w1")
    stuck = new_execution(conn, S.SCHEDULED)
    fresh = new_execution(conn, S.SCHEDULED)
    running_old = new_execution(conn, S.RUNNING)
    conn.execute("UPDATE execution SET worker = %s WHERE id IN (%s, %s, %s)", (w, stuck, fresh, running_old))
    with conn.transaction():
        conn.execute("ALTER TABLE execution DISABLE TRIGGER execution_guard")
        conn.execute(
            "UPDATE execution SET updated = now() - interval '10 minutes' WHERE id IN (%s, %s)", (stuck, running_old)
        )
        conn.execute("ALTER TABLE execution ENABLE TRIGGER execution_guard")

    cutoff = datetime.now(UTC) - timedelta(seconds=300)  # scheduled_timeout, client clock as in the seed
    with psycopg.RawCursor(conn, row_factory=dict_row) as cur:
        cur.execute(TIMEOUT_MONITOR, (cutoff,))
        found = cur.fetchall()
        assert [r["id"] for r in found] == [stuck]
        assert found[0]["status"] == "scheduled"
        # The seed's failing statement is a legal transition (scheduled -> failed).
        cur.execute(
            FAIL_EXECUTION,
            (
                stuck,
                Jsonb(
                    {
                        "error": "Execution timeout: worker did not pick up task within timeout",
                        "failed_by": "execution_timeout_monitor",
                    }
                ),
            ),
        )
        assert cur.rowcount == 1
        cur.execute(TIMEOUT_MONITOR, (cutoff,))
        assert cur.fetchall() == []
    row = execution_row(conn, stuck)
    assert row["status"] == "failed"
    assert row["result"]["failed_by"] == "execution_timeout_monitor"
    assert execution_row(conn, fresh)["status"] == "scheduled"


# ---------------------------------------------------------------------------
# Timestamps come from the database clock
# ---------------------------------------------------------------------------

BOGUS = datetime(2000, 1, 1, tzinfo=UTC)


def test_execution_timestamps_are_stamped_by_the_database(conn: Conn) -> None:
    with conn.transaction():
        now = conn.execute("SELECT now() AS now").fetchone()["now"]
        row = conn.execute(
            "INSERT INTO execution (action_ref, created, updated) VALUES ('core.noop', %s, %s) "
            "RETURNING id, created, updated",
            (BOGUS, BOGUS),
        ).fetchone()
    assert row["created"] == now
    assert row["updated"] == now

    with conn.transaction():
        later = conn.execute("SELECT now() AS now").fetchone()["now"]
        updated = conn.execute(
            "UPDATE execution SET parameters = '{\"a\": 1}', updated = %s, created = created "
            "WHERE id = %s RETURNING created, updated",
            (BOGUS, row["id"]),
        ).fetchone()
    assert updated["updated"] == later
    assert updated["updated"] > row["updated"]
    assert updated["created"] == now

    with conn.transaction():
        via_api_now = conn.execute("SELECT now() AS now").fetchone()["now"]
        eid = conn.execute("SELECT request_execution('core.noop', '{}') AS id").fetchone()["id"]
        stamped = conn.execute("SELECT created, updated FROM execution WHERE id = %s", (eid,)).fetchone()
    assert stamped == {"created": via_api_now, "updated": via_api_now}


def test_worker_and_action_updated_is_stamped_on_update(conn: Conn) -> None:
    wid = add_worker(conn, "w-clock")
    with conn.transaction():
        now = conn.execute("SELECT now() AS now").fetchone()["now"]
        row = conn.execute(
            "UPDATE worker SET capacity = 7, updated = %s WHERE id = %s RETURNING updated", (BOGUS, wid)
        ).fetchone()
    assert row["updated"] == now
    with conn.transaction():
        now = conn.execute("SELECT now() AS now").fetchone()["now"]
        row = conn.execute(
            "UPDATE action SET description = 'x', updated = %s WHERE ref = 'core.noop' RETURNING updated", (BOGUS,)
        ).fetchone()
    assert row["updated"] == now
