"""The advancer's cache of task and dispatch rows (executor/workflow_rows.py, RowCache):
the state the conductor is given from the cache is the state the database holds, and a
change made elsewhere (a verb) is read, not the cached copy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.executor.workflow_rows import rows_of
from conveyor.executor.workflows import Advancer
from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.conductor import advance
from conveyor.workflows.spec import RetrySpec, TaskSpec, Transition, WithItems, WorkflowSpec
from conveyor.workflows.state import Event, Step, WorkflowState
from integration.builders import Conn, Pool, row
from integration.workflows.kit import children, end, started, wf_id

SPEC = WorkflowSpec(
    ref="tests.cache",
    tasks={
        "each": TaskSpec("each", "core.echo", {"message": "<% item() %>"},
                         with_items=WithItems(["a", "b", "c", "d"], concurrency=2),
                         retry=RetrySpec(count=1), next=(Transition(None, (("all", "<% result() %>"),), ("last",)),)),
        "last": TaskSpec("last", "core.noop"),
    },
)  # fmt: skip


class Checked:
    """The real conductor, after checking that the state it is given is the stored one."""

    def __init__(self, conn: Conn, wid: int) -> None:
        self.conn, self.wid, self.calls = conn, wid, 0

    def __call__(self, spec: WorkflowSpec, state: WorkflowState, events: Sequence[Event]) -> Step:
        tasks = self.conn.execute("SELECT * FROM workflow_task WHERE workflow_execution = %s", (self.wid,)).fetchall()
        ds = self.conn.execute("SELECT * FROM workflow_task_dispatch WHERE workflow_execution = %s", (self.wid,))
        stored = rows_of(tasks, ds.fetchall())
        assert state.tasks == stored.tasks
        assert state.dispatches == stored.dispatches
        self.calls += 1
        return advance(spec, state, events)


def running(conn: Conn, eid: int) -> list[dict[str, Any]]:
    return [c for c in children(conn, eid) if c["status"] == "requested"]


async def test_cached_rows_are_the_stored_rows(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport, SPEC)
    wid = wf_id(conn, eid)
    decide = Checked(conn, wid)
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    version = conn.execute("SELECT xmin::text AS v FROM workflow_execution WHERE id = %s", (wid,)).fetchone()
    assert version is not None
    assert advancer._cache.get(wid, version["v"]) is not None  # the next advancement reads no rows
    first = running(conn, eid)[0]["id"]
    end(conn, first, "failed")  # a retry replaces the chain's child
    await advancer.run_pass()
    # A verb changes the workflow row: the cache no longer matches, the rows are read.
    conn.execute("SELECT pause_execution(%s, 'test')", (eid,))
    await advancer.run_pass()
    conn.execute("SELECT resume_execution(%s, 'test')", (eid,))
    await advancer.run_pass()
    while (kids := running(conn, eid)) and row(conn, eid)["status"] == "running":
        for kid in kids:
            end(conn, kid["id"], "completed", {"out": kid["parameters"].get("message")})
        await advancer.run_pass()
    assert row(conn, eid)["status"] == "completed"
    assert decide.calls >= 7
