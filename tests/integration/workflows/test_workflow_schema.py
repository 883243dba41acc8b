"""The workflow tables' invariants (seed 001, phase 3) and the workflow start: one state
per workflow execution (create-or-get), one dispatch per (task, item, iteration), one
event per child's end, started by a scheduling round with no worker, depth-limited."""

from __future__ import annotations

import psycopg
import pytest

from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, Pool, add_worker, row
from integration.workflows.kit import events, register, request, sequence, start, state


def test_registration_is_a_new_version_and_an_action(conn: Conn) -> None:
    spec = sequence(description="first")
    assert register(conn, spec) == 1
    assert register(conn, spec) == 2
    action = conn.execute("SELECT * FROM action WHERE ref = 'tests.seq'").fetchone()
    assert action is not None
    assert (action["runner_type"], action["runtime"], action["pack"], action["name"]) == (
        "workflow", "conveyor", "tests", "seq",
    )  # fmt: skip
    versions = conn.execute("SELECT version FROM workflow_definition ORDER BY version").fetchall()
    assert [v["version"] for v in versions] == [1, 2]


def test_a_workflow_cannot_replace_a_workers_action(conn: Conn) -> None:
    with pytest.raises(psycopg.Error) as caught:
        register(conn, sequence(ref="core.noop"))
    assert caught.value.sqlstate == "CVC03"


async def test_start_needs_no_worker_and_is_create_or_get(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    register(conn, sequence())
    eid = request(conn, "tests.seq", {"a": 1})
    result = await start(pool, transport)
    assert (result.claimed, result.dispatched, result.failed) == (1, 1, 0)
    assert row(conn, eid)["status"] == "running"
    wf = state(conn, eid)
    assert wf is not None
    assert (wf["version"], wf["depth"], wf["status"]) == (1, 0, "running")
    assert events(conn, eid) == [("start", {})]
    # A second creation for the same execution is refused by the constraint.
    with pytest.raises(psycopg.errors.UniqueViolation) as caught:
        conn.execute("INSERT INTO workflow_execution (execution, workflow_ref, version) VALUES (%s, 'tests.seq', 1)",
                      (eid,))  # fmt: skip
    assert caught.value.diag.constraint_name == "uq_workflow_execution_execution"


async def test_start_twice_creates_one_state(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    register(conn, sequence())
    eid = request(conn, "tests.seq")
    # A claim as if a replica had died after claiming: started by start_workflows twice.
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 'x' WHERE id = %s", (eid,))
    first = conn.execute("SELECT * FROM start_workflows(%s, 'x')", ([eid],)).fetchall()
    second = conn.execute("SELECT * FROM start_workflows(%s, 'x')", ([eid],)).fetchall()
    assert [r["status"] for r in first] == ["running"]
    assert second == []  # no longer scheduling: nothing to start
    assert conn.execute("SELECT count(*) AS n FROM workflow_execution").fetchone() == {"n": 1}
    assert [k for k, _ in events(conn, eid)] == ["start"]


async def test_running_workflows_keep_their_version(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    register(conn, sequence())
    first = request(conn, "tests.seq")
    await start(pool, transport)
    register(conn, sequence(actions=("core.noop", "core.noop")))
    second = request(conn, "tests.seq")
    await start(pool, transport)
    assert [state(conn, e)["version"] for e in (first, second)] == [1, 2]  # type: ignore[index]


async def test_depth_limit(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    register(conn, sequence())
    top = request(conn, "tests.seq")
    await start(pool, transport, max_depth=1)
    child = request(conn, "tests.seq", parent=top)
    await start(pool, transport, max_depth=1)
    assert state(conn, child)["depth"] == 1  # type: ignore[index]
    grandchild = request(conn, "tests.seq", parent=child)
    result = await start(pool, transport, max_depth=1)
    assert (result.claimed, result.failed) == (1, 1)
    failed = row(conn, grandchild)
    assert failed["status"] == "failed"
    assert failed["result"]["error"] == "workflow tests.seq nested too deep: depth 2 exceeds workflow.max_depth (1)"
    assert state(conn, grandchild) is None


async def test_deleted_workflow_refuses_new_requests(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    register(conn, sequence())
    running = request(conn, "tests.seq")
    await start(pool, transport)
    late = request(conn, "tests.seq")
    assert conn.execute("SELECT delete_workflow('tests.seq') AS n").fetchone() == {"n": 1}
    await start(pool, transport)
    assert row(conn, late)["status"] == "failed"
    assert "was deleted" in row(conn, late)["result"]["error"]
    assert row(conn, running)["status"] == "running"  # keeps its version
    # Never requested: deleting takes the action away (requests are refused as unknown).
    register(conn, sequence(ref="tests.other"))
    conn.execute("SELECT delete_workflow('tests.other')")
    assert conn.execute("SELECT 1 FROM action WHERE ref = 'tests.other'").fetchone() is None


async def test_one_event_per_child_end(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    register(conn, sequence())
    wf = request(conn, "tests.seq")
    await start(pool, transport)
    child = request(conn, "core.noop", parent=wf)
    other = request(conn, "core.noop")  # no parent: no event
    for eid in (child, other):
        conn.execute("UPDATE execution SET status = 'cancelled', ended = now() WHERE id = %s", (eid,))
    assert events(conn, wf) == [("start", {}), ("child_ended", {})]
    kinds = conn.execute("SELECT kind, execution FROM workflow_event ORDER BY id").fetchall()
    assert kinds[-1] == {"kind": "child_ended", "execution": child}
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO workflow_event (workflow_execution, kind, execution) "
            "SELECT id, 'child_ended', %s FROM workflow_execution", (child,),
        )  # fmt: skip


async def test_child_end_wakes_the_workflow_topic(db_url: str, conn: Conn, pool: Pool,
                                                  transport: PostgresTransport) -> None:  # fmt: skip
    register(conn, sequence())
    wf = request(conn, "tests.seq")
    await start(pool, transport)
    child = request(conn, "core.noop", parent=wf)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute('LISTEN "conveyor.workflow"')
        conn.execute("UPDATE execution SET status = 'cancelled', ended = now() WHERE id = %s", (child,))
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == ["conveyor.workflow"]


def test_dispatch_dedupe(conn: Conn) -> None:
    register(conn, sequence())
    eid = request(conn, "tests.seq")
    wf = conn.execute(
        "INSERT INTO workflow_execution (execution, workflow_ref, version) VALUES (%s, 'tests.seq', 1) RETURNING id",
        (eid,),
    ).fetchone()
    assert wf is not None
    insert = (
        "INSERT INTO workflow_task_dispatch (workflow_execution, task_name, task_index, iteration)"
        " VALUES (%s, %s, %s, %s)"
    )
    conn.execute(insert, (wf["id"], "t0", None, 0))
    conn.execute(insert, (wf["id"], "t0", None, 1))  # another iteration of a cycle
    conn.execute(insert, (wf["id"], "t0", 0, 0))  # an item
    for args in ((None, 0), (0, 0)):
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(insert, (wf["id"], "t0", *args))


async def test_workers_recovery_leaves_running_workflows_alone(conn: Conn, pool: Pool,
                                                               transport: PostgresTransport) -> None:  # fmt: skip
    add_worker(conn, "w1")
    register(conn, sequence())
    eid = request(conn, "tests.seq")
    await start(pool, transport)
    assert row(conn, eid)["worker"] is None  # what the sweep takes for "its worker is gone"
    with conn.transaction():
        lost = conn.execute(Q["lost_running"]).fetchall()
    assert [r["id"] for r in lost] == []
