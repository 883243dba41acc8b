"""The workflow verbs as SQL functions (cancel with a policy, pause, resume, rerun from
the failed tasks) and the timeouts the reconciler turns into events."""

from __future__ import annotations

import psycopg
import pytest

from conveyor.executor.workflows import Advancer
from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.state import (
    CancelRequested,
    NewChild,
    PauseRequested,
    Rerun,
    ResumeRequested,
    Step,
    TaskRun,
    TimedOut,
)
from integration.builders import Conn, Pool, row
from integration.workflows.kit import Scripted, children, dispatches, end, events, start, started, state, wf_id

ECHO = NewChild("t0", 0, None, "core.echo", {"message": "hi"})


async def test_cancel_goes_through_canceling(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, children=(ECHO,)))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    answer = conn.execute("SELECT * FROM cancel_execution(%s, 'me')", (eid,)).fetchone()
    assert answer == {"id": eid, "was": "running", "now": "canceling", "worker": None}
    assert row(conn, eid)["cancelled_by"] == "me"
    child = children(conn, eid)[0]["id"]
    # It was only requested: cancelled by the verb itself (nothing of the tree starts after it).
    assert row(conn, child)["status"] == "cancelled"
    assert row(conn, child)["cancelled_by"] == f"workflow execution {eid}"
    decide.steps = [Step(context={}, status="cancelled")]
    await advancer.run_pass()  # the cancel, and the child's end
    assert [type(e).__name__ for e in decide.calls[-1][1]] == ["CancelRequested", "ChildEnded"]
    assert decide.calls[-1][1][0] == CancelRequested("allow_finish")
    assert row(conn, eid)["status"] == "cancelled"
    assert row(conn, eid)["result"]["error"] == "cancelled by me"


async def test_cancel_policy(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    conn.execute("SELECT * FROM cancel_workflow(%s, 'me', 'cancel_running')", (eid,))
    await advancer.run_pass()
    assert decide.calls[-1][1] == [CancelRequested("cancel_running")]
    assert state(conn, eid)["cancel_policy"] == "cancel_running"  # type: ignore[index]
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT * FROM cancel_workflow(%s, 'me', 'whenever')", (eid,))
    assert caught.value.sqlstate == "CVA02"


async def test_cancel_of_a_workflow_not_started_is_immediate(conn: Conn, pool: Pool,
                                                             transport: PostgresTransport) -> None:  # fmt: skip
    await started(conn, pool, transport)
    eid = conn.execute("SELECT request_execution('tests.seq') AS id").fetchone()["id"]  # type: ignore[index]
    answer = conn.execute("SELECT * FROM cancel_execution(%s, 'me')", (eid,)).fetchone()
    assert answer == {"id": eid, "was": "requested", "now": "cancelled", "worker": None}


async def test_pause_and_resume(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    assert conn.execute("SELECT * FROM pause_execution(%s, 'me')", (eid,)).fetchone() == {
        "id": eid, "was": "running", "now": "paused"}  # fmt: skip
    assert row(conn, eid)["status"] == "paused"
    # Again: nothing changes, the answer says where it is.
    assert conn.execute("SELECT * FROM pause_execution(%s, 'me')", (eid,)).fetchone() == {
        "id": eid, "was": "paused", "now": "paused"}  # fmt: skip
    decide.steps = [Step(context={}, status="paused")]
    await advancer.run_pass()
    assert decide.calls[-1][1] == [PauseRequested()]
    assert conn.execute("SELECT * FROM resume_execution(%s, 'me')", (eid,)).fetchone() == {
        "id": eid, "was": "paused", "now": "running"}  # fmt: skip
    decide.steps = [Step(context={}, status="running")]
    await advancer.run_pass()
    assert decide.calls[-1][1] == [ResumeRequested()]
    assert (row(conn, eid)["status"], state(conn, eid)["status"]) == ("running", "running")  # type: ignore[index]
    # Not a workflow: refused by saying so (now NULL).
    plain = conn.execute("SELECT request_execution('core.noop') AS id").fetchone()["id"]  # type: ignore[index]
    assert conn.execute("SELECT now FROM pause_execution(%s, 'me')", (plain,)).fetchone() == {"now": None}


async def test_a_paused_workflow_can_end(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    advancer = Advancer(pool, decide=Scripted(Step(context={}), Step(context={}, status="failed",
                                                                     errors=({"error": "x"},))))  # fmt: skip
    await advancer.run_pass()
    conn.execute("SELECT * FROM pause_execution(%s, 'me')", (eid,))
    await advancer.run_pass()
    assert row(conn, eid)["status"] == "failed"


async def test_rerun_from_failed_keeps_what_succeeded(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport, parameters={})
    wid = wf_id(conn, eid)
    decide = Scripted(Step(context={"v": 1}, children=(ECHO, NewChild("t1", 0, None, "core.noop", {}))))
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    ok, bad = (k["id"] for k in children(conn, eid))
    end(conn, ok, "completed", {"r": "ok"})
    end(conn, bad, "failed")
    conn.execute(
        "INSERT INTO workflow_task (workflow_execution, task_name, status, result) VALUES"
        " (%s, 't0', 'succeeded', '{\"r\": \"ok\"}'), (%s, 't1', 'failed', NULL)", (wid, wid),
    )  # fmt: skip
    conn.execute(
        "UPDATE workflow_task_dispatch SET status = CASE task_name WHEN 't0' THEN 'succeeded' ELSE 'failed' END"
    )
    decide.steps = [Step(context={"v": 1}, status="failed", errors=({"error": "t1 failed"},))]
    await advancer.run_pass()
    assert row(conn, eid)["status"] == "failed"
    with pytest.raises(psycopg.Error) as caught:  # only an ended, unsuccessful workflow
        conn.execute("SELECT rerun_execution(%s, true, 'me')", (ok,))
    assert caught.value.sqlstate == "CVN04"
    again = conn.execute("SELECT rerun_execution(%s, true, 'me') AS id", (eid,)).fetchone()["id"]  # type: ignore[index]
    copy = state(conn, again)
    assert copy is not None
    assert (copy["rerun_of"], copy["context"], copy["version"]) == (wid, {"v": 1}, 1)
    # Copied whole: the conductor's rerun starts the failed instance as a new iteration.
    assert [(d["task_name"], d["status"]) for d in dispatches(conn, again)] == [("t0", "succeeded"),
                                                                                 ("t1", "failed")]  # fmt: skip
    tasks = conn.execute("SELECT task_name, status FROM workflow_task WHERE workflow_execution = %s"
                         " ORDER BY task_name", (copy["id"],)).fetchall()  # fmt: skip
    assert tasks == [{"task_name": "t0", "status": "succeeded"}, {"task_name": "t1", "status": "failed"}]
    assert events(conn, again) == [("rerun", {"tasks": [["t1", 0]], "by": "me", "rerun_of": eid})]
    # Not advanced before its execution starts; started, it is not started again from scratch.
    assert (await advancer.run_pass()).advanced == 0
    decide.steps = [Step(context={"v": 1}, tasks=(TaskRun("t1"),))]
    await start(pool, transport)
    assert row(conn, again)["status"] == "running"
    await advancer.run_pass()
    assert decide.calls[-1][1] == [Rerun((("t1", 0),))]
    given = decide.calls[-1][0]
    assert {key: t.status for key, t in given.tasks.items()} == {("t0", 0): "succeeded", ("t1", 0): "failed"}
    assert {key: d.status for key, d in given.dispatches.items()} == {("t0", 0, None): "succeeded",
                                                                      ("t1", 0, None): "failed"}  # fmt: skip


async def test_rerun_refused_while_running(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT rerun_execution(%s, true, 'me')", (eid,))
    assert caught.value.sqlstate == "CVC04"


async def test_timeouts_fire_once(conn: Conn, pool: Pool, transport: PostgresTransport) -> None:
    eid = await started(conn, pool, transport)
    decide = Scripted(Step(context={}, children=(NewChild("t0", 0, None, "core.echo", {"message": "x"},
                                                          timeout=0.0),)))  # fmt: skip
    advancer = Advancer(pool, decide=decide)
    await advancer.run_pass()
    conn.execute("UPDATE workflow_execution SET deadline = now() - interval '1 second'")
    assert await advancer.timeouts() == 2
    assert await advancer.timeouts() == 0
    await advancer.run_pass()
    assert sorted(decide.calls[-1][1], key=repr) == sorted([TimedOut("t0", 0), TimedOut()], key=repr)
    assert events(conn, eid) == []
