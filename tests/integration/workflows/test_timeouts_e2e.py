"""Per-workflow and per-task timeouts end to end: the definition's ``timeout`` becomes a
deadline row, the reconciler turns it into a 'timeout' event, the conductor fails the
workflow (or the task) and cancels what still runs."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.domain.status import TERMINAL
from conveyor.workflows.parse import parse_workflow
from integration.builders import Conn, row
from integration.workflows.kit import children, register, request
from support.polling import until


async def ended(conn: Conn, eid: int) -> dict[str, Any]:
    await until(lambda: row(conn, eid)["status"] in TERMINAL, 30, f"execution {eid} to end")
    return row(conn, eid)


async def test_a_workflow_past_its_timeout_fails_naming_it_and_cancels_its_running_child(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    spec = parse_workflow("""
ref: tests.wf_timeout
timeout: 1.5
tasks:
  slow: {action: core.sleep seconds=60}
""")
    register(conn, spec)
    eid = request(conn, "tests.wf_timeout")
    sql = "SELECT deadline - created AS left FROM workflow_execution WHERE execution = %s"
    # The deadline is set when the workflow starts (and cleared when it fires).
    await until(lambda: conn.execute(sql, (eid,)).fetchone() is not None, 20, "the workflow to start")
    left = conn.execute(sql, (eid,)).fetchone()
    assert left is not None
    assert left["left"].total_seconds() == 1.5, left
    await until(lambda: [c["status"] for c in children(conn, eid)] == ["running"], 20, "the child to run")
    done = await ended(conn, eid)
    assert done["status"] == "failed", done
    assert "tests.wf_timeout timed out after 1.5 s" in done["result"]["error"]
    [error] = done["result"]["errors"]
    assert (error["type"], error["timeout"]) == ("timeout", 1.5)
    await until(lambda: [c["status"] for c in children(conn, eid)] == ["cancelled"], 20, "the child cancelled")
    task = conn.execute(
        "SELECT t.status FROM workflow_task t JOIN workflow_execution w ON w.id = t.workflow_execution"
        " WHERE w.execution = %s",
        (eid,),
    ).fetchall()
    assert task == [{"status": "cancelled"}]


async def test_a_task_past_its_timeout_fails_and_its_failure_transition_runs(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    spec = parse_workflow("""
ref: tests.task_timeout
tasks:
  slow:
    action: core.sleep seconds=60
    timeout: 1
    next:
      - when: <% failed() %>
        publish: [why: <% result().error %>]
        do: after
  after:
    action: core.echo message=<% ctx(why) %>
output:
  - why: <% ctx(why) %>
""")
    register(conn, spec)
    eid = request(conn, "tests.task_timeout")
    done = await ended(conn, eid)
    # The failure was handled (a transition on failed()): the workflow goes on and succeeds.
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"why": "task 'slow' timed out"}
    slow, after = children(conn, eid)
    assert (slow["action_ref"], after["action_ref"]) == ("core.sleep", "core.echo")
    await until(lambda: row(conn, slow["id"])["status"] == "cancelled", 20, "the slow child cancelled")
    assert after["parameters"] == {"message": "task 'slow' timed out"}
