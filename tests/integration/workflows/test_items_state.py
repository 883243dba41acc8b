"""Regression: a ``with`` task's items and concurrency survive between advancements.

The conductor evaluates a ``with`` task's items once, when the instance starts, and
dispatches later items from that list (TaskRun.items / .concurrency). The advancement
stored neither, so the next advancement read the task back without them and every
``with`` task failed its workflow ("workflow advancement failed: AssertionError") as
soon as its first child ended. Found by the workflow crash tests
(tests/acceptance/test_workflow_crashes.py)."""

from __future__ import annotations

from conveyor.executor.workflows import Advancer
from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.spec import TaskSpec, WithItems, WorkflowSpec
from integration.builders import Conn, Pool
from integration.workflows.kit import children, end, started


async def test_a_with_task_dispatches_its_later_items_from_the_stored_list(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    spec = WorkflowSpec(
        ref="tests.items_state",
        tasks={
            "each": TaskSpec(
                name="each",
                action="core.echo",
                input={"message": "<% item() %>"},
                with_items=WithItems(["a", "b", "c"], concurrency=2),
            )
        },
    )
    eid = await started(conn, pool, transport, spec)
    advancer = Advancer(pool)  # the real conductor
    await advancer.run_pass()
    stored = conn.execute("SELECT items, concurrency, items_total FROM workflow_task").fetchone()
    assert stored == {"items": ["a", "b", "c"], "concurrency": 2, "items_total": 3}
    first = sorted(children(conn, eid), key=lambda k: k["parameters"]["message"])
    assert [k["parameters"] for k in first] == [{"message": "a"}, {"message": "b"}]
    end(conn, first[0]["id"], "completed", "a")
    await advancer.run_pass()
    kids = sorted(children(conn, eid), key=lambda k: k["parameters"]["message"])
    assert [k["parameters"] for k in kids] == [{"message": "a"}, {"message": "b"}, {"message": "c"}]
    for k in kids[1:]:
        end(conn, k["id"], "completed", k["parameters"]["message"])
    await advancer.run_pass()
    done = conn.execute("SELECT status, result FROM execution WHERE id = %s", (eid,)).fetchone()
    assert done is not None
    assert (done["status"], done["result"]) == ("completed", {}), done  # no output declared
