"""Orquesta workflows run unchanged, end to end (the executor and a worker in-process).

The files in ``orquesta/`` are copied byte for byte from StackStorm's repositories
(Apache-2.0): ``sequential``, ``join`` and ``with-items`` from StackStorm/orquesta
``orquesta/tests/fixtures/workflows/native/`` (commit 8c67ef3), the two error-handling
ones from StackStorm/st2 ``contrib/examples/actions/workflows/`` (commit c2eaf56). They carry
no ``ref:``: it is given at registration, as ``--ref`` does. ``core.local`` is a test
stand-in with StackStorm's parameters (conftest: ours takes no ``timeout``). ``core.echo`` is
ours, which returns the message itself where StackStorm's returns ``{stdout: ...}``
(docs/workflows.md), so the orquesta fixtures, written with ``result()``, fit it unchanged.

Also here: an expression failing at run time, and a core.ask inside a workflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.domain.status import TERMINAL
from conveyor.store.queries import Q
from conveyor.workflows.parse import parse_workflow
from conveyor.workflows.validate import validate
from integration.builders import Conn, row
from integration.workflows.kit import children, register, request
from support.polling import until

EXAMPLES = Path(__file__).parent / "orquesta"


async def ended(conn: Conn, eid: int) -> dict[str, Any]:
    await until(lambda: row(conn, eid)["status"] in TERMINAL, 30, f"execution {eid} to end")
    return row(conn, eid)


def register_example(conn: Conn, name: str, ref: str) -> None:
    spec = parse_workflow((EXAMPLES / f"{name}.yaml").read_text(), ref=ref)
    known = {r["ref"] for r in conn.execute("SELECT ref FROM action").fetchall()}
    assert validate(spec, known) == []
    register(conn, spec)


def by_task(conn: Conn, eid: int) -> dict[str, list[dict[str, Any]]]:
    """The children of each task (by the dispatch rows), in order."""
    rows = conn.execute(
        "SELECT d.task_name, e.* FROM workflow_task_dispatch d JOIN workflow_execution w ON w.id = d.workflow_execution"
        " JOIN execution e ON e.id = d.execution WHERE w.execution = %s ORDER BY e.id",
        (eid,),
    ).fetchall()
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["task_name"], []).append(r)
    return out


async def test_sequential_with_publish(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    register_example(conn, "sequential", "examples.sequential")
    done = await ended(conn, request(conn, "examples.sequential", {"name": "Stanley"}))
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"greeting": "Stanley, All your base are belong to us!"}
    assert [c["parameters"]["message"] for c in children(conn, done["id"])] == [
        "Stanley",
        "All your base are belong to us!",
        "Stanley, All your base are belong to us!",
    ]


async def test_parallel_branches_and_join_all(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    register_example(conn, "join", "examples.join")
    done = await ended(conn, request(conn, "examples.join"))
    assert done["status"] == "completed", done["result"]
    tasks = by_task(conn, done["id"])
    assert sorted(tasks) == [f"task{n}" for n in range(1, 8)]
    assert all(len(runs) == 1 for runs in tasks.values())  # task6 joined once, task7 ran once
    assert tasks["task6"][0]["created"] >= max(tasks[t][0]["ended"] for t in ("task3", "task5"))


async def test_with_items_in_item_order(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    register_example(conn, "with-items", "examples.with_items")
    members = ["Lakshmi", "Lindsay", "Tomaz", "Matt", "Drew"]
    done = await ended(conn, request(conn, "examples.with_items", {"members": members}))
    assert done["status"] == "completed", done["result"]
    [task] = conn.execute(
        "SELECT t.result FROM workflow_task t JOIN workflow_execution w ON w.id = t.workflow_execution"
        " WHERE w.execution = %s",
        (done["id"],),
    ).fetchall()
    assert task["result"] == [f"{m}, resistance is futile!" for m in members]


async def test_error_handling_with_noop(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    register_example(conn, "orquesta-error-handling-noop", "examples.handle_noop")
    failing = await ended(conn, request(conn, "examples.handle_noop", {"cmd": "exit 1", "timeout": 10}))
    assert failing["status"] == "completed", failing["result"]  # the failure was handled: noop
    assert failing["result"] == {"message": "$%#&@#$!!!"}
    assert [c["status"] for c in children(conn, failing["id"])] == ["failed"]
    fine = await ended(conn, request(conn, "examples.handle_noop", {"cmd": "echo hi", "timeout": 10}))
    assert fine["status"] == "completed", fine["result"]
    assert fine["result"] == {"message": "hooray!!!"}
    assert children(conn, fine["id"])[0]["result"]["data"]["stdout"] == "hi"  # StackStorm's shape


async def test_remediate_then_fail(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    register_example(conn, "orquesta-error-handling-fail-manually", "examples.handle_fail")
    done = await ended(conn, request(conn, "examples.handle_fail", {"cmd": "exit 1", "timeout": 10}))
    assert done["status"] == "failed"
    tasks = by_task(conn, done["id"])
    assert (tasks["task1"][0]["status"], tasks["task3"][0]["status"]) == ("failed", "completed")
    assert "task2" not in tasks
    assert done["result"]["succeeded"] is False
    assert any(e.get("task") == "task3" for e in done["result"]["errors"]), done["result"]


async def test_an_expression_failing_at_run_time_fails_the_workflow_naming_it(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    spec = parse_workflow("""
ref: tests.bad_expression
tasks:
  build:
    action: core.echo message=built
    next:
      - when: <% succeeded() %>
        publish: [image: <% result().image.tag %>]
        do: deploy
  deploy:
    action: core.echo message=<% ctx(image) %>
""")
    register(conn, spec)
    done = await ended(conn, request(conn, "tests.bad_expression"))
    assert done["status"] == "failed"
    [error] = done["result"]["errors"]
    # The task, where in it, the expression and yaql's reason (a string has no `image`).
    assert (error["task"], error["where"], error["expression"]) == ("build", "next[0].publish.image",
                                                                    "<% result().image.tag %>")  # fmt: skip
    assert 'Unknown function "#property#image"' in error["message"]
    assert "next[0].publish.image" in done["result"]["error"]
    assert [c["action_ref"] for c in children(conn, done["id"])] == ["core.echo"]  # deploy never ran


ASKING = """
ref: tests.approval
tasks:
  start:
    action: core.noop
    next: [{do: [approve, other]}]
  approve:
    action: core.ask
    input:
      prompt: deploy?
      schema: {type: object, properties: {approved: {type: boolean}}, required: [approved]}
    next:
      - when: <% succeeded() %>
        publish: [answer: <% result().response %>]
        do: deploy
  other:
    action: core.echo message="the other branch"
  deploy:
    action: core.echo message="approved=<% ctx(answer).approved %>"
output:
  - answer: <% ctx(answer) %>
"""


async def test_core_ask_in_a_workflow_pends_while_another_branch_completes(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    register(conn, parse_workflow(ASKING))
    eid = request(conn, "tests.approval")

    def asking() -> list[dict[str, Any]]:
        return [c for c in children(conn, eid) if c["action_ref"] == "core.ask"]

    await until(lambda: [c["status"] for c in asking()] == ["pending"], 20, "the ask to pend")
    other = lambda: [c for c in children(conn, eid) if c["action_ref"] == "core.echo"]  # noqa: E731
    await until(lambda: [c["status"] for c in other()] == ["completed"], 20, "the other branch to complete")
    assert row(conn, eid)["status"] == "running"
    assert [c["status"] for c in asking()] == ["pending"]  # still waiting, holding no worker
    [ask] = asking()
    inquiry = conn.execute("SELECT id FROM inquiry WHERE execution = %s", (ask["id"],)).fetchone()
    assert inquiry is not None

    async def respond(data: Any) -> dict[str, Any]:
        # Through the services' pool: a blocking call on the test's connection would stall
        # the event loop the executor runs in, while the answer waits for its lock.
        params = {"id": inquiry["id"], "responder": "alice", "role": "operator", "data": Jsonb(data)}
        async with world.connection() as c:
            answered = await (await c.execute(Q["respond_inquiry"], params)).fetchone()
        assert answered is not None
        return dict(answered)

    first = await respond({"approved": True})
    done = await ended(conn, eid)
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"answer": {"approved": True}}
    again = await respond({"approved": False})  # too late: changes nothing
    assert again["outcome"] != first["outcome"]
    deploys = [c for c in other() if c["parameters"]["message"].startswith("approved=")]
    assert [c["parameters"] for c in deploys] == [{"message": "approved=true"}]
    # The answer resumed the workflow exactly once: one instance of each task after it.
    instances = conn.execute(
        "SELECT t.task_name, count(*)::int AS n FROM workflow_task t JOIN workflow_execution w"
        " ON w.id = t.workflow_execution WHERE w.execution = %s GROUP BY t.task_name ORDER BY t.task_name",
        (eid,),
    ).fetchall()
    assert instances == [{"task_name": n, "n": 1} for n in ("approve", "deploy", "other", "start")]
    assert row(conn, eid)["status"] == "completed"
