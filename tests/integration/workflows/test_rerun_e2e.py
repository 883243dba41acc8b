"""Rerun from the failed tasks, end to end with the real conductor and a worker: the
failed task runs again, what completed is kept (not run again), the output has both
(found by the docs review: the SQL copy and the conductor disagreed, and a rerun ran
nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.workflows.spec import TaskSpec, Transition, WithItems, WorkflowSpec
from integration.builders import Conn, row
from integration.workflows.kit import children, register, request
from integration.workflows.test_end_to_end import ended


def flaky(ref: str, gate: Path) -> WorkflowSpec:
    """first -> gated (fails until ``gate`` exists) -> last; output from all three."""
    return WorkflowSpec(
        ref=ref,
        tasks={
            "first": TaskSpec("first", "core.echo", {"message": "one"},
                              next=(Transition("<% succeeded() %>", (("a", "<% result() %>"),), ("gated",)),)),
            "gated": TaskSpec("gated", "core.local", {"cmd": f"test -f {gate} && echo open"},
                              next=(Transition("<% succeeded() %>", (("b", "<% result().stdout %>"),), ("last",)),)),
            "last": TaskSpec("last", "core.echo", {"message": "three"},
                             next=(Transition("<% succeeded() %>", (("c", "<% result() %>"),)),)),
        },
        output=(("a", "<% ctx(a) %>"), ("b", "<% ctx(b) %>"), ("c", "<% ctx(c) %>")),
    )  # fmt: skip


async def test_rerun_from_failed_runs_the_failed_task_and_keeps_the_rest(
    conn: Conn, world: AsyncConnectionPool[Any], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    register(conn, flaky("tests.rerun", gate))
    eid = request(conn, "tests.rerun")
    failed = await ended(conn, eid)
    assert failed["status"] == "failed", failed["result"]
    assert [c["action_ref"] for c in children(conn, eid)] == ["core.echo", "core.local"]

    gate.touch()
    again = conn.execute("SELECT rerun_execution(%s, true, 'me') AS id", (eid,)).fetchone()["id"]  # type: ignore[index]
    done = await ended(conn, again)
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"a": "one", "b": "open", "c": "three"}
    # Only the failed task and what follows it ran again: 'first' is not repeated.
    assert [c["action_ref"] for c in children(conn, again)] == ["core.local", "core.echo"]
    tasks = conn.execute(
        "SELECT t.task_name, t.iteration, t.status FROM workflow_task t JOIN workflow_execution w"
        " ON w.id = t.workflow_execution WHERE w.execution = %s ORDER BY t.task_name, t.iteration", (again,)
    ).fetchall()  # fmt: skip
    assert [(t["task_name"], t["iteration"], t["status"]) for t in tasks] == [
        ("first", 0, "succeeded"), ("gated", 0, "failed"), ("gated", 1, "succeeded"), ("last", 0, "succeeded"),
    ]  # fmt: skip
    assert row(conn, eid)["status"] == "failed"  # the original stays as it ended


async def test_rerun_of_a_with_task_runs_its_items_again(
    conn: Conn, world: AsyncConnectionPool[Any], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    spec = WorkflowSpec(
        ref="tests.rerun_items",
        tasks={"each": TaskSpec("each", "core.local", {"cmd": f"test <% item() %> = 1 || test -f {gate}"},
                                with_items=WithItems([1, 2, 3], concurrency=1))},
    )  # fmt: skip
    register(conn, spec)
    eid = request(conn, "tests.rerun_items")
    assert (await ended(conn, eid))["status"] == "failed"
    gate.touch()
    again = conn.execute("SELECT rerun_execution(%s, true, 'me') AS id", (eid,)).fetchone()["id"]  # type: ignore[index]
    done = await ended(conn, again)
    assert done["status"] == "completed", done["result"]
    assert len(children(conn, again)) == 3  # a with task reruns all its items (docs/workflow-semantics.md)
