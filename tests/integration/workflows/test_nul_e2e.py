"""Data a workflow makes up must not take the executor down: a published value holding a
NUL character (which PostgreSQL's jsonb refuses) fails that workflow with the error named,
and the next workflow runs."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.workflows.spec import TaskSpec, Transition, WorkflowSpec
from integration.builders import Conn
from integration.workflows.kit import register, request, sequence
from integration.workflows.test_end_to_end import ended


async def test_a_nul_in_published_data_fails_the_workflow_not_the_executor(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    spec = WorkflowSpec(
        ref="tests.nul",
        tasks={"a": TaskSpec("a", "core.noop", next=(Transition(None, (("x", '{{ "a\\x00b" }}'),)),))},
        output=(("x", "<% ctx(x) %>"),),
    )
    register(conn, spec)
    eid = request(conn, "tests.nul")
    done = await ended(conn, eid)
    assert done["status"] == "failed"
    assert "\x00" not in str(done["result"])
    register(conn, sequence("tests.after"))
    assert (await ended(conn, request(conn, "tests.after")))["status"] == "completed"
