"""Helpers for the workflow integration tests: definitions registered as the CLI will
(register_workflow with WorkflowSpec.to_json()), workflow executions started by a real
scheduling round, and the state rows read back."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.spec import TaskSpec, Transition, WorkflowSpec
from integration.builders import Conn, Pool, scheduler


def register(conn: Conn, spec: WorkflowSpec, source: str = "") -> int:
    row = conn.execute(
        "SELECT register_workflow(%s, %s, %s, %s, %s) AS v",
        (spec.ref, Jsonb(spec.to_json()), source, spec.description, Jsonb(spec.parameters_schema)),
    ).fetchone()
    assert row is not None
    return int(row["v"])


def sequence(ref: str = "tests.seq", actions: tuple[str, ...] = ("core.noop",), **kw: Any) -> WorkflowSpec:
    """A workflow of tasks t0 -> t1 -> ... each running one of ``actions``."""
    tasks = {}
    for i, action in enumerate(actions):
        nxt = (Transition(when="<% succeeded() %>", do=(f"t{i + 1}",)),) if i + 1 < len(actions) else ()
        tasks[f"t{i}"] = TaskSpec(name=f"t{i}", action=action, next=nxt)
    return WorkflowSpec(ref=ref, tasks=tasks, **kw)


def request(conn: Conn, ref: str, parameters: dict[str, Any] | None = None, parent: int | None = None) -> int:
    row = conn.execute("SELECT request_execution(%s, %s, %s) AS id", (ref, Jsonb(parameters or {}), parent)).fetchone()
    assert row is not None
    return int(row["id"])


async def start(pool: Pool, transport: PostgresTransport, executor_id: str = "ex-test", max_depth: int = 10) -> Any:
    s = scheduler(pool, transport, executor_id)
    s._workflow_max_depth = max_depth
    return await s.run_round()


def state(conn: Conn, execution: int) -> dict[str, Any] | None:
    return conn.execute("SELECT * FROM workflow_execution WHERE execution = %s", (execution,)).fetchone()


def events(conn: Conn, execution: int) -> list[tuple[str, Any]]:
    return [
        (r["kind"], r["payload"])
        for r in conn.execute(
            "SELECT ev.kind, ev.payload FROM workflow_event ev"
            " JOIN workflow_execution w ON w.id = ev.workflow_execution WHERE w.execution = %s ORDER BY ev.id",
            (execution,),
        ).fetchall()
    ]


class Scripted:
    """A stand-in for the conductor: returns the next scripted Step (or a function of the
    state and events) and records what it was given."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.calls: list[tuple[Any, list[Any]]] = []

    def __call__(self, spec: Any, state: Any, events: Any) -> Any:
        self.calls.append((state, list(events)))
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        return step(state, events) if callable(step) else step


async def started(conn: Conn, pool: Pool, transport: PostgresTransport, spec: WorkflowSpec | None = None,
                  parameters: dict[str, Any] | None = None) -> int:  # fmt: skip
    """A registered workflow's execution, started (running, with its 'start' event)."""
    spec = spec or sequence()
    if conn.execute("SELECT 1 FROM workflow_definition WHERE ref = %s", (spec.ref,)).fetchone() is None:
        register(conn, spec)
    eid = request(conn, spec.ref, parameters)
    await start(pool, transport)
    return eid


def children(conn: Conn, parent: int) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM execution WHERE parent = %s ORDER BY id", (parent,)).fetchall()


def dispatches(conn: Conn, execution: int) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT d.* FROM workflow_task_dispatch d JOIN workflow_execution w ON w.id = d.workflow_execution"
        " WHERE w.execution = %s ORDER BY d.task_name, d.iteration, d.task_index",
        (execution,),
    ).fetchall()


def wf_id(conn: Conn, execution: int) -> int:
    row = state(conn, execution)
    assert row is not None
    return int(row["id"])


# The edges a child takes from requested to each end (the guard trigger checks them).
_PATHS = {
    "completed": ("scheduling", "scheduled", "running", "completed"),
    "timeout": ("scheduling", "scheduled", "running", "timeout"),
    "failed": ("scheduling", "failed"),
    "cancelled": ("cancelled",),
}


def end(conn: Conn, execution: int, status: str = "completed", result: Any = None) -> None:
    """A requested child ends as the services would end it (its event comes from the trigger)."""
    for step in _PATHS[status]:
        conn.execute("UPDATE execution SET status = %s, result = %s WHERE id = %s", (step, Jsonb(result), execution))
