"""The workflow and task status graphs (conveyor.domain.workflow_status) are the database's
(migration 0038): the transition tables hold the same edges, and the triggers refuse any
other status change, whatever statement makes it -- the advancement's own writes included."""

from __future__ import annotations

import itertools
import re

import psycopg
import pytest

from conveyor.domain.workflow_status import TASK_TRANSITIONS, WORKFLOW_TRANSITIONS, WorkflowGraph, edges
from conveyor.store.queries import Q
from integration.builders import Conn
from integration.workflows.kit import register, request, sequence


def _table(conn: Conn, table: str) -> set[tuple[str, str]]:
    rows = conn.execute(f"SELECT from_status, to_status FROM {table}").fetchall()
    return {(r["from_status"], r["to_status"]) for r in rows}


def _checked_statuses(conn: Conn, table: str) -> set[str]:
    definition = conn.execute(
        "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint "
        "WHERE conrelid = %s::regclass AND contype = 'c' AND conname = %s",
        (table, f"{table}_status_check"),
    ).fetchone()["d"]
    return set(re.findall(r"'(\w+)'::text", definition))


@pytest.mark.parametrize(
    ("graph", "table", "rows"),
    [
        (WORKFLOW_TRANSITIONS, "workflow_transition", "workflow_execution"),
        (TASK_TRANSITIONS, "workflow_task_transition", "workflow_task"),
    ],
)
def test_the_tables_are_the_domain_graphs(conn: Conn, graph: WorkflowGraph, table: str, rows: str) -> None:
    assert _table(conn, table) == edges(graph)
    assert _checked_statuses(conn, rows) == set(graph)  # every status has its row in the graph


def _workflow(conn: Conn, status: str) -> int:
    """A workflow execution's state row created in ``status`` (creation is not guarded)."""
    eid = request(conn, "tests.seq")
    row = conn.execute(
        "INSERT INTO workflow_execution (execution, workflow_ref, version, status) VALUES (%s, 'tests.seq', 1, %s) "
        "RETURNING id",
        (eid, status),
    ).fetchone()
    return int(row["id"])


def test_every_pair_of_workflow_statuses(conn: Conn) -> None:
    register(conn, sequence())
    for source, target in itertools.permutations(WORKFLOW_TRANSITIONS, 2):
        wid = _workflow(conn, source)
        update = "UPDATE workflow_execution SET status = %s WHERE id = %s RETURNING status"
        if target in WORKFLOW_TRANSITIONS[source]:
            assert conn.execute(update, (target, wid)).fetchone() == {"status": target}
        else:
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                conn.execute(update, (target, wid))
            message = caught.value.diag.message_primary
            assert message == f"illegal workflow transition {source} -> {target} (workflow execution {wid})"
    # Keeping the status is no transition: the state's other columns change freely.
    wid = _workflow(conn, "succeeded")
    conn.execute("UPDATE workflow_execution SET status = 'succeeded', context = '{\"a\": 1}' WHERE id = %s", (wid,))


def test_every_pair_of_task_statuses(conn: Conn) -> None:
    register(conn, sequence())
    wid = _workflow(conn, "running")
    insert = "INSERT INTO workflow_task (workflow_execution, task_name, iteration, status) VALUES (%s, %s, 0, %s)"
    update = "UPDATE workflow_task SET status = %s WHERE workflow_execution = %s AND task_name = %s RETURNING status"
    for n, (source, target) in enumerate(itertools.permutations(TASK_TRANSITIONS, 2)):
        name = f"t{n}"
        conn.execute(insert, (wid, name, source))
        if target in TASK_TRANSITIONS[source]:
            assert conn.execute(update, (target, wid, name)).fetchone() == {"status": target}
        else:
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                conn.execute(update, (target, wid, name))
            message = caught.value.diag.message_primary
            assert message == (
                f"illegal workflow task transition {source} -> {target} (task {name} iteration 0 "
                f"of workflow execution {wid})"
            )


def test_the_advancements_writes_are_guarded(conn: Conn) -> None:
    """An upsert of the advancement (workflow_upsert_tasks, workflow_update) that would
    move an ended row is refused, as any other statement."""
    register(conn, sequence())
    wid = _workflow(conn, "cancelled")
    conn.execute(
        "INSERT INTO workflow_task (workflow_execution, task_name, iteration, status) VALUES (%s, 'a', 0, 'succeeded')",
        (wid,),
    )
    tasks = {
        "wids": [wid],
        "names": ["a"],
        "iterations": [0],
        "statuses": ["running"],
        "arrivals": ["[]"],
        "items_totals": [None],
        "items": [None],
        "concurrencies": [None],
        "results": [None],
        "errors": [None],
    }
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal workflow task transition succeeded -> running"):
        conn.execute(Q["workflow_upsert_tasks"], tasks)
    update = {
        "ids": [wid],
        "statuses": ["running"],
        "contexts": ["{}"],
        "outputs": [None],
        "errors": ["[]"],
        "cancel_policies": ["allow_finish"],
    }
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal workflow transition cancelled -> running"):
        conn.execute(Q["workflow_update"], update)
