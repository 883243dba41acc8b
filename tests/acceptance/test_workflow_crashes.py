"""Acceptance: workflow advancement survives an executor SIGKILLed at every step of it,
with real executor and worker processes.

Each crash point of the advancing transaction (conveyor/ops/failpoints.py: after the dispatch
rows, after the child rows, before commit, after commit) and the window before it (a
child's completion committed while no executor is alive): the doomed executor dies
there, a replacement starts, and the database must show every workflow completed with
the output of a run without faults, one child per (task, item, retry) chain, every
join fired once, nothing left to apply (workflow_kit.check_workflows). Then a worker
SIGKILLed under a workflow's task: the task is run again per the action's retry policy
(same child, a second attempt) and the workflow completes.
"""

from __future__ import annotations

import pytest

from acceptance.helpers import Procs, conveyor_env, until
from acceptance.recovery_kit import RECOVERY_SETTINGS, start_worker
from acceptance.workflow_kit import (
    SIGKILLED,
    WORKFLOW_SETTINGS,
    Conn,
    all_ended,
    check_workflows,
    pending_events,
    register_all,
    request_mix,
    start_executor,
)

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **WORKFLOW_SETTINGS)


def test_workflows_run_to_completion_without_faults(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """The baseline the crash scenarios are held to: the same checks, nothing killed."""
    register_all(db)
    start_worker(procs, env, "wa")
    start_executor(procs, env, "executor")
    made = request_mix(db, 6)
    all_ended(procs, db, list(made))
    check_workflows(db, made)


# Inside the advancing transaction: rolled back with the connection, events kept.
INSIDE = ("workflow.after_dispatch_row", "workflow.after_child_row", "workflow.before_commit")


@pytest.mark.parametrize("point", [*INSIDE, "workflow.after_commit"])
def test_executor_killed_inside_an_advancement(procs: Procs, env: dict[str, str], db: Conn, point: str) -> None:
    """The 4th time the doomed executor reaches ``point`` it SIGKILLs itself; a
    replacement applies what it left, and nothing is made twice."""
    register_all(db)
    start_worker(procs, env, "wa")
    doomed = start_executor(procs, env, "doomed", CONVEYOR_FAILPOINTS=f"{point}@4")
    made = request_mix(db, 9)
    assert doomed.wait(30) == SIGKILLED, doomed.logs()
    assert f"failpoint {point}: SIGKILL" in doomed.stderr()
    unfinished = db.execute(
        "SELECT count(*) AS n FROM execution WHERE id = ANY(%s) AND status = 'running'", (list(made),)
    ).fetchone()
    assert unfinished is not None
    assert unfinished["n"] > 0, "the crash was meant to leave workflows unfinished"
    if point in INSIDE:
        # The advancement in flight was rolled back whole: its events are still there.
        assert pending_events(db) > 0
    start_executor(procs, env, "replacement")
    all_ended(procs, db, list(made))
    check_workflows(db, made)


def test_children_end_while_no_executor_is_alive(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """Children complete (their events committed with them) after the only executor was
    SIGKILLed and before a new one starts: the new one applies each completion once."""
    register_all(db)
    start_worker(procs, env, "wa")
    doomed = start_executor(procs, env, "doomed")
    made = request_mix(db, 4, ("crash.slow",))
    naps = until(procs, lambda: (rows := db.execute(
        "SELECT id FROM execution WHERE parent = ANY(%s) AND status = 'running'", (list(made),)).fetchall()
    ) and len(rows) == len(made) and rows)  # fmt: skip
    doomed.kill()
    until(procs, lambda: db.execute(
        "SELECT bool_and(status = 'completed') AS ok FROM execution WHERE id = ANY(%s)", ([r["id"] for r in naps],)
    ).fetchone()["ok"])  # fmt: skip
    # Every completion waits as an event; no workflow moved on.
    assert pending_events(db) == len(made)
    kids = db.execute("SELECT count(*) AS n FROM execution WHERE parent = ANY(%s)", (list(made),)).fetchone()
    assert kids == {"n": len(made)}, "a workflow moved on with no executor alive"
    start_executor(procs, env, "replacement")
    all_ended(procs, db, list(made))
    check_workflows(db, made)


def test_worker_killed_under_a_task_the_task_runs_again(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """A worker SIGKILLed while it runs a workflow's task: the child is recovered per the
    action's retry policy (core.sleep: retried when its worker is lost) on the other
    worker, as a second attempt of the same child, and the workflow goes on."""
    register_all(db)
    workers = {name: start_worker(procs, env, name) for name in ("wa", "wb")}
    start_executor(procs, env, "executor")
    made = request_mix(db, 4, ("crash.slow",))
    running = until(procs, lambda: db.execute(
        "SELECT e.id, w.name FROM execution e JOIN worker w ON w.id = e.worker"
        " WHERE e.parent = ANY(%s) AND e.status = 'running' ORDER BY e.id LIMIT 1", (list(made),)
    ).fetchone())  # fmt: skip
    victim = running["name"]
    workers[victim].kill()
    # Every child the victim was running (claimed or started) is retried; the others not.
    lost = until(procs, lambda: {r["execution"] for r in db.execute(
        "SELECT execution FROM execution_attempt WHERE worker_name = %s AND outcome = 'worker_lost'", (victim,)
    ).fetchall()})  # fmt: skip
    assert running["id"] in lost
    all_ended(procs, db, list(made))
    check_workflows(db, made, attempts=dict.fromkeys(lost, 2))
    second = db.execute("SELECT worker_name, outcome FROM execution_attempt WHERE execution = %s AND attempt = 2",
                        (running["id"],)).fetchone()  # fmt: skip
    assert second == {"worker_name": ({"wa", "wb"} - {victim}).pop(), "outcome": "completed"}
