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
