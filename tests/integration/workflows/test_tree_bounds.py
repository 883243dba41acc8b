"""What one top-level workflow may create in all (workflow.max_tree_executions,
workflow.max_tree_tasks): a runaway definition fails with the bound's error, the tree
ends, and the counters are exact -- also when several transactions charge one tree at
once, as replicas advancing different sub-workflows of it do."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.domain.status import TERMINAL
from conveyor.store.db import connect_sync
from conveyor.workflows.spec import TaskSpec, Transition, WithItems, WorkflowSpec
from integration.builders import Conn, row
from integration.workflows.kit import children, register, request, wf_id
from support.polling import until

MAX_EXECUTIONS = 20
MAX_TASKS = 10


@pytest.fixture
def workflow_settings() -> dict[str, Any]:
    return {"max_tree_executions": MAX_EXECUTIONS, "max_tree_tasks": MAX_TASKS}


def tree(conn: Conn, root: int) -> list[dict[str, Any]]:
    """Every execution under ``root``, at any depth."""
    return conn.execute(
        "WITH RECURSIVE t AS (SELECT id, status FROM execution WHERE parent = %s"
        " UNION ALL SELECT e.id, e.status FROM t JOIN execution e ON e.parent = t.id) SELECT * FROM t",
        (root,),
    ).fetchall()


def counted(conn: Conn, root: int) -> dict[str, Any] | None:
    return conn.execute("SELECT tasks, executions FROM workflow_tree WHERE root = %s", (root,)).fetchone()


async def ended(conn: Conn, eid: int) -> dict[str, Any]:
    await until(lambda: row(conn, eid)["status"] in TERMINAL, 60, f"execution {eid} to end")
    return row(conn, eid)


async def test_a_fan_out_over_the_bound_fails_naming_it_creates_exactly_the_bound_and_cancels_the_rest(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    # One item at a time (each advancement asks for one child: the count is reached
    # exactly), beside a task that sleeps: running when the 21st child is asked for.
    spec = WorkflowSpec(ref="tests.wide", tasks={
        "slow": TaskSpec("slow", "core.local", {"cmd": "sleep 120"}),
        "each": TaskSpec("each", "core.local", {"cmd": "true"}, with_items=WithItems(list(range(50)), concurrency=1)),
    })  # fmt: skip
    register(conn, spec)
    eid = request(conn, "tests.wide")
    done = await ended(conn, eid)
    assert done["status"] == "failed"
    expected = (f"workflow execution {eid} and its sub-workflows would request more than {MAX_EXECUTIONS} child "
                "executions (workflow.max_tree_executions)")  # fmt: skip
    assert done["result"]["error"] == expected
    # What it started and still ran is cancelled (long before the sleeps would end).
    await until(lambda: all(c["status"] in TERMINAL for c in children(conn, eid)), 60, "its children to end")
    made = children(conn, eid)
    assert len(made) == MAX_EXECUTIONS  # the 21st was never made
    assert [c["status"] for c in made if c["parameters"]["cmd"] != "true"] == ["cancelled"]
    assert counted(conn, eid) == {"tasks": 2, "executions": MAX_EXECUTIONS}


async def test_a_self_recursive_fan_out_fails_with_the_bound_and_the_whole_tree_ends(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    # Each level runs itself 3 times: 3 + 9 = 12 sub-workflows fit, the 27 of level 3 do not.
    spec = WorkflowSpec(ref="tests.again", tasks={
        "again": TaskSpec("again", "tests.again", with_items=WithItems([1, 2, 3])),
    })  # fmt: skip
    register(conn, spec)
    eid = request(conn, "tests.again")
    done = await ended(conn, eid)
    assert done["status"] == "failed"
    assert "workflow.max_tree_executions" in done["result"]["error"], done["result"]
    await until(lambda: all(e["status"] in TERMINAL for e in tree(conn, eid)), 60, "the whole tree to end")
    made = tree(conn, eid)
    assert 12 < len(made) <= MAX_EXECUTIONS  # levels 1 and 2, and some of level 3 until the bound
    count = counted(conn, eid)
    assert count is not None
    assert count["executions"] == len(made)  # exact: every child counted once, none refused counted


async def test_task_instances_over_the_bound_fail_naming_it(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    # An action-less chain of 12 tasks: one advancement would create 12 instances.
    tasks = {f"t{i}": TaskSpec(f"t{i}", None, next=(Transition(None, (), (f"t{i + 1}",)),) if i < 11 else ())
             for i in range(12)}  # fmt: skip
    register(conn, WorkflowSpec(ref="tests.chain", tasks=tasks))
    eid = request(conn, "tests.chain")
    done = await ended(conn, eid)
    assert done["status"] == "failed"
    expected = (f"workflow execution {eid} and its sub-workflows would create more than {MAX_TASKS} task "
                "instances (workflow.max_tree_tasks)")  # fmt: skip
    assert done["result"]["error"] == expected
    assert conn.execute("SELECT count(*) AS n FROM workflow_task WHERE workflow_execution = %s",
                        (wf_id(conn, eid),)).fetchone() == {"n": 0}  # fmt: skip


async def test_within_the_bounds_nothing_changes(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    spec = WorkflowSpec(ref="tests.fits", tasks={
        "each": TaskSpec("each", "core.noop", with_items=WithItems(list(range(MAX_EXECUTIONS)))),
    })  # fmt: skip
    register(conn, spec)
    eid = request(conn, "tests.fits")
    done = await ended(conn, eid)
    assert done["status"] == "completed", done["result"]
    assert counted(conn, eid) == {"tasks": 1, "executions": MAX_EXECUTIONS}


def test_concurrent_charges_to_one_tree_are_exact(conn: Conn, db_url: str) -> None:
    """Eight sessions charge sub-workflows of one tree one child at a time, each in its own
    transaction: exactly the bound is granted, and the row holds exactly what was granted."""
    register(conn, WorkflowSpec(ref="tests.leaf", tasks={"t": TaskSpec("t", "core.noop")}))
    root = request(conn, "tests.leaf")
    subs = []
    for _ in range(8):  # workflow rows of sub-workflows of root (the charge walks execution.parent)
        child = request(conn, "tests.leaf", parent=root)
        found = conn.execute("INSERT INTO workflow_execution (execution, workflow_ref, version, depth)"
                             " VALUES (%s, 'tests.leaf', 1, 1) RETURNING id", (child,)).fetchone()  # fmt: skip
        assert found is not None
        subs.append(int(found["id"]))
    bound, attempts = 150, 40  # 8 x 40 = 320 attempts at 150 places
    granted: list[int] = []
    refused: list[str | None] = []
    lock = threading.Lock()

    def charge(wid: int) -> None:
        with connect_sync(db_url, "conveyor", autocommit=True) as c:
            for _ in range(attempts):
                try:
                    c.execute("SELECT charge_workflow_trees(%s, %s, %s, %s, %s)", ([wid], [0], [1], 10**6, bound))
                except psycopg.Error as e:
                    with lock:
                        refused.append(e.sqlstate)
                else:
                    with lock:
                        granted.append(wid)

    threads = [threading.Thread(target=charge, args=(wid,)) for wid in subs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert (len(granted), len(refused)) == (bound, 8 * attempts - bound)
    assert set(refused) == {"CVB01"}  # refused for the bound, nothing else
    assert counted(conn, root) == {"tasks": 0, "executions": bound}
