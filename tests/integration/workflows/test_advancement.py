"""The advancement applied to the real database with hand-made decisions (a scripted
conductor): children requested once per (task, item, iteration, retry), events consumed
with the effects, serialized between replicas, and a broken workflow failed alone."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.executor.workflows import Advancer
from conveyor.ops import failpoints
from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.state import ChildEnded, Dispatch, NewChild, Started, Step, TaskRun
from integration.builders import Conn, Pool, row
from integration.workflows.kit import Scripted, children, dispatches, end, events, started, state, wf_id

ECHO = NewChild("t0", 0, None, "core.echo", {"message": "hi"})


async def test_a_step_requests_children_and_consumes_events(conn: Conn, pool: Pool,
                                                            transport: PostgresTransport) -> None:  # fmt: skip
    eid = await started(conn, pool, transport, parameters={})
    step = Step(context={"x": 1}, tasks=(TaskRun("t0"),), children=(ECHO, NewChild("t1", 0, 3, "core.noop", {})))
    decide = Scripted(step)
    assert (await Advancer(pool, decide=decide).run_pass()).advanced == 1
    assert decide.calls[0][1] == [Started(parameters={})]
    kids = children(conn, eid)
    assert [(k["action_ref"], k["parameters"], k["status"]) for k in kids] == [
        ("core.echo", {"message": "hi"}, "requested"), ("core.noop", {}, "requested"),
    ]  # fmt: skip
    got = [(d["task_name"], d["task_index"], d["execution"], d["retry"], d["status"]) for d in dispatches(conn, eid)]
    assert got == [("t0", None, kids[0]["id"], 0, "running"), ("t1", 3, kids[1]["id"], 0, "running")]
    assert events(conn, eid) == []
    wf = state(conn, eid)
    assert wf is not None
    assert wf["context"] == {"x": 1}
    tasks = conn.execute("SELECT task_name, status FROM workflow_task").fetchall()
    assert tasks == [{"task_name": "t0", "status": "running"}]
    # Nothing pending: the next pass does nothing and asks nothing.
    assert (await Advancer(pool, decide=decide).run_pass()).advanced == 0
    assert len(decide.calls) == 1


async def test_failpoints_are_reached_in_order_inside_and_after_the_transaction(
    conn: Conn, pool: Pool, transport: PostgresTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The advancement is pipelined: each point must still be where failpoints.py says --
    # the three first inside the uncommitted transaction (with before_commit armed, its
    # statements executed first), after_commit once the children are visible to others.
    eid = await started(conn, pool, transport)
    seen: list[tuple[str, int, int]] = []

    def reach(name: str) -> None:
        if name.startswith("workflow."):
            seen.append((name, len(children(conn, eid)), len(events(conn, eid))))

    monkeypatch.setattr(failpoints, "reach", reach)
    monkeypatch.setattr(failpoints, "armed", lambda name: name == "workflow.before_commit")
    assert (await Advancer(pool, decide=Scripted(Step(context={}, children=(ECHO,)))).run_pass()).advanced == 1
    assert seen == [
        ("workflow.after_dispatch_row", 0, 1), ("workflow.after_child_row", 0, 1),
        ("workflow.before_commit", 0, 1), ("workflow.after_commit", 1, 0),
    ]  # fmt: skip


async def test_a_childs_end_reaches_the_conductor_once(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, children=(ECHO,)), Step(context={}))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    child = children(conn, eid)[0]["id"]
    end(conn, child, "completed", {"out": 1})
    await advancer.run_pass()
    assert decide.calls[1][1] == [ChildEnded(child, "t0", 0, None, "completed", {"out": 1})]
    await advancer.run_pass()
    assert len(decide.calls) == 2


async def test_the_same_child_is_never_requested_twice(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    # A conductor deciding the same child again (a duplicate event, a replayed decision):
    # the dispatch row exists with this retry number: no second child.
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, children=(ECHO,)))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    conn.execute("INSERT INTO workflow_event (workflow_execution, kind) VALUES (%s, 'resume')", (wf_id(conn, eid),))
    await advancer.run_pass()
    assert len(decide.calls) == 2
    assert len(children(conn, eid)) == 1
    # The next retry of the chain is a new child, which replaces the dispatch's current one.
    first = children(conn, eid)[0]["id"]
    end(conn, first, "failed")
    decide.steps = [Step(context={}, children=(NewChild("t0", 0, None, "core.echo", {"message": "again"}, retry=1),))]
    await advancer.run_pass()
    kids = children(conn, eid)
    assert len(kids) == 2
    [d] = dispatches(conn, eid)
    assert (d["execution"], d["retry"]) == (kids[1]["id"], 1)


async def test_two_replicas_apply_an_event_once(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    ids = [await started(conn, pool, transport) for _ in range(5)]

    def slow(state: object, events: object) -> Step:
        return Step(context={}, children=(ECHO,))

    a, b = Advancer(pool, decide=Scripted(slow)), Advancer(pool, decide=Scripted(slow))
    for _ in range(3):  # each replica runs passes concurrently with the other
        await asyncio.gather(a.run_pass(), b.run_pass(), a.run_pass(), b.run_pass())
    for eid in ids:
        assert len(children(conn, eid)) == 1
        assert events(conn, eid) == []


async def test_two_replicas_advance_one_workflow_in_turn(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    # Both race for one workflow with many events: each event applied exactly once.
    eid = await started(conn, pool, transport)
    wid = wf_id(conn, eid)
    seen: list[object] = []

    def record(state: object, evs: list[object]) -> Step:
        seen.extend(evs)
        return Step(context={})

    for _ in range(20):
        conn.execute("INSERT INTO workflow_event (workflow_execution, kind) VALUES (%s, 'resume')", (wid,))
    a, b = Advancer(pool, decide=Scripted(record)), Advancer(pool, decide=Scripted(record))
    results = await asyncio.gather(a.advance(wid), b.advance(wid))
    assert sorted(results) in (["advanced", "skipped"], ["advanced", "advanced"])
    await a.run_pass()
    assert len(seen) == 21  # 20 resumes and the start, each once
    assert events(conn, eid) == []


async def test_end_of_a_workflow_ends_its_execution(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    ok = await started(conn, pool, transport)
    bad = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, status="succeeded", output={"answer": 42}))
    await Advancer(pool, decide=decide).advance(wf_id(conn, ok))
    errors = ({"task": "t0", "error": "boom"},)
    await Advancer(pool, decide=Scripted(Step(context={}, status="failed", errors=errors))).advance(wf_id(conn, bad))
    assert (row(conn, ok)["status"], row(conn, ok)["result"]) == ("completed", {"answer": 42})
    assert row(conn, bad)["status"] == "failed"
    assert row(conn, bad)["result"] == {"succeeded": False, "error": "boom", "errors": list(errors),
                                        "failed_by": "workflow"}  # fmt: skip
    assert [state(conn, e)["status"] for e in (ok, bad)] == ["succeeded", "failed"]  # type: ignore[index]


async def test_a_broken_workflow_fails_alone(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    corrupt = await started(conn, pool, transport)
    unknown = await started(conn, pool, transport)
    fine = await started(conn, pool, transport)
    conn.execute("UPDATE workflow_definition SET definition = '{\"tasks\": 7}'")

    def decide(state: object, events: object) -> Step:
        return Step(context={}, children=(ECHO,))

    advancer = Advancer(pool, decide=Scripted(decide))
    result = await advancer.run_pass()
    assert (result.advanced, result.failed) == (0, 3)  # every one of them reads the corrupt definition
    for eid in (corrupt, unknown, fine):
        assert row(conn, eid)["status"] == "failed"
        assert "definition tests.seq version 1 is corrupt" in row(conn, eid)["result"]["error"]
        assert events(conn, eid) == []


async def test_an_unknown_action_fails_the_workflow_naming_it(conn: Conn, pool: Pool,
                                                              transport: PostgresTransport) -> None:  # fmt: skip
    eid = await started(conn, pool, transport)
    other = await started(conn, pool, transport)
    step = Step(context={}, children=(NewChild("t0", 0, None, "nope.missing", {}),))
    decide = Scripted(step, Step(context={}, children=(ECHO,)))  # the oldest event first: eid's
    result = await Advancer(pool, decide=decide).run_pass()
    assert (result.advanced, result.failed) == (1, 1)
    assert row(conn, eid)["status"] == "failed"
    assert row(conn, eid)["result"]["error"] == (
        "workflow advancement failed: unknown action (task: action): t0: nope.missing"
    )
    assert children(conn, eid) == []  # rolled back with the decision
    assert row(conn, other)["status"] == "running"
    assert len(children(conn, other)) == 1


async def test_a_stale_child_end_is_dropped(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, children=(ECHO,)), Step(context={}))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    child = children(conn, eid)[0]["id"]
    conn.execute("UPDATE workflow_task_dispatch SET execution = NULL")  # its chain moved on
    end(conn, child, "completed")
    await advancer.run_pass()
    assert len(decide.calls) == 1  # no event left to decide on: not asked
    assert events(conn, eid) == []


async def test_dispatch_rows_record_ended_children(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, children=(ECHO,)))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    child = children(conn, eid)[0]["id"]
    end(conn, child, "completed", {"r": 1})
    ended = Dispatch("t0", 0, None, child, status="succeeded", result={"r": 1})
    decide.steps = [Step(context={}, tasks=(TaskRun("t0", status="succeeded", result={"r": 1}),), dispatches=(ended,))]
    await advancer.run_pass()
    [d] = dispatches(conn, eid)
    assert (d["status"], d["result"], d["execution"]) == ("succeeded", {"r": 1}, child)
    task = conn.execute("SELECT status, result, ended FROM workflow_task").fetchone()
    assert task is not None
    assert (task["status"], task["result"]) == ("succeeded", {"r": 1})
    assert task["ended"] is not None
