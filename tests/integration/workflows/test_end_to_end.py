"""Workflows end to end in-process: the scheduling round starts them, the advancement
(the real conductor) requests children, a real worker runs them."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.domain.status import TERMINAL
from conveyor.workflows.spec import InputSpec, RetrySpec, TaskSpec, Transition, WithItems, WorkflowSpec
from integration.builders import Conn, row
from integration.workflows.kit import children, register, request
from support.polling import until


async def ended(conn: Conn, eid: int) -> dict[str, Any]:
    await until(lambda: row(conn, eid)["status"] in TERMINAL, 30, f"execution {eid} to end")
    return row(conn, eid)


def child_refs(conn: Conn, eid: int) -> list[str]:
    return [c["action_ref"] for c in children(conn, eid)]


async def test_sequence_with_publish_and_output(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    spec = WorkflowSpec(
        ref="tests.seq",
        input=(InputSpec("who"),),
        tasks={
            "greet": TaskSpec("greet", "core.echo", {"message": "hello <% ctx(who) %>"},
                              next=(Transition("<% succeeded() %>", (("said", "<% result() %>"),), ("again",)),)),
            "again": TaskSpec("again", "core.echo", {"message": "<% ctx(said) %>!"}),
        },
        output=(("said", "<% ctx(said) %>"),),
    )  # fmt: skip
    register(conn, spec)
    eid = request(conn, "tests.seq", {"who": "world"})
    done = await ended(conn, eid)
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"said": "hello world"}
    assert child_refs(conn, eid) == ["core.echo", "core.echo"]
    assert [c["parameters"] for c in children(conn, eid)] == [{"message": "hello world"}, {"message": "hello world!"}]


async def test_with_items_in_order_and_concurrency(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    items = [f"i{n}" for n in range(7)]
    spec = WorkflowSpec(
        ref="tests.items",
        tasks={"each": TaskSpec("each", "core.echo", {"message": "<% item() %>"},
                                with_items=WithItems(items, concurrency=2),
                                next=(Transition(None, (("all", "<% result() %>"),)),))},
        output=(("all", "<% ctx(all) %>"),),
    )  # fmt: skip
    register(conn, spec)
    eid = request(conn, "tests.items")
    done = await ended(conn, eid)
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"all": items}
    assert len(children(conn, eid)) == 7
    # Never more than 2 children running at once: their [started, ended] intervals.
    spans = [(c["started"], c["ended"]) for c in children(conn, eid)]
    for start, _ in spans:
        assert sum(1 for s, e in spans if s <= start < e) <= 2


async def test_join_all_fires_once(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    spec = WorkflowSpec(
        ref="tests.join",
        tasks={
            "a": TaskSpec("a", "core.noop", next=(Transition(None, (), ("c",)),)),
            "b": TaskSpec("b", "core.echo", {"message": "b"}, next=(Transition(None, (), ("c",)),)),
            "c": TaskSpec("c", "core.echo", {"message": "joined"}, join="all"),
        },
    )
    register(conn, spec)
    eid = request(conn, "tests.join")
    done = await ended(conn, eid)
    assert done["status"] == "completed", done["result"]
    assert sorted(child_refs(conn, eid)) == ["core.echo", "core.echo", "core.noop"]


async def test_retries_then_fails(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    spec = WorkflowSpec(ref="tests.retry", tasks={"t": TaskSpec("t", "tests.fail", retry=RetrySpec(count=2))})
    register(conn, spec)
    eid = request(conn, "tests.retry")
    done = await ended(conn, eid)
    assert done["status"] == "failed"
    assert done["result"]["succeeded"] is False
    assert child_refs(conn, eid) == ["tests.fail"] * 3  # one try and two retries, one chain
    [d] = conn.execute("SELECT retry, status FROM workflow_task_dispatch").fetchall()
    assert d == {"retry": 2, "status": "failed"}


async def test_cancel_running_cancels_children(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    spec = WorkflowSpec(ref="tests.slow", tasks={"t": TaskSpec("t", "core.sleep", {"seconds": 60})})
    register(conn, spec)
    eid = request(conn, "tests.slow")
    await until(lambda: [c["status"] for c in children(conn, eid)] == ["running"], 20, "the child to run")
    conn.execute("SELECT * FROM cancel_workflow(%s, 'me', 'cancel_running')", (eid,))
    done = await ended(conn, eid)
    assert done["status"] == "cancelled"
    assert [c["status"] for c in children(conn, eid)] == ["cancelled"]


async def test_sub_workflow(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    register(conn, WorkflowSpec(ref="tests.inner", input=(InputSpec("m"),),
                                tasks={"t": TaskSpec("t", "core.echo", {"message": "<% ctx(m) %>"},
                                                     next=(Transition(None, (("r", "<% result() %>"),)),))},
                                output=(("r", "<% ctx(r) %>"),)))  # fmt: skip
    register(conn, WorkflowSpec(ref="tests.outer",
                                tasks={"sub": TaskSpec("sub", "tests.inner", {"m": "deep"},
                                                       next=(Transition(None, (("got", "<% result() %>"),)),))},
                                output=(("got", "<% ctx(got) %>"),)))  # fmt: skip
    eid = request(conn, "tests.outer")
    done = await ended(conn, eid)
    assert done["status"] == "completed", done["result"]
    assert done["result"] == {"got": {"r": "deep"}}
    [inner] = children(conn, eid)
    assert inner["action_ref"] == "tests.inner"
    assert conn.execute("SELECT depth FROM workflow_execution WHERE execution = %s", (inner["id"],)).fetchone() == {
        "depth": 1
    }
