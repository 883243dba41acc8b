"""The worker supervises its runs: a failure inside the worker while running one action
(not the action's own failure) ends that execution failed with the reason, and the
worker stays up and keeps taking work. Before, such a run's task died unobserved and its
execution stayed ``running`` for as long as the worker lived."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from acceptance.helpers import Procs, conveyor_env, eventually
from conveyor.sdk import request_execution

Conn = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _status(db: Conn, eid: int) -> dict[str, Any] | None:
    row = db.execute("SELECT status, result FROM execution WHERE id = %s", (eid,)).fetchone()
    return dict(row) if row else None


def test_a_run_that_breaks_inside_the_worker_fails_alone(procs: Procs, env: dict[str, str], db: Conn) -> None:
    # A subprocess action whose stored settings the worker cannot use (a timeout that is
    # not a number: written by hand, as a broken registration from another version might).
    db.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, metadata) "
        "VALUES ('t.broken', 't', 'broken', 'subprocess', 'shell', %s)",
        (Jsonb({"argv": None, "shell": True, "command_parameter": "cmd", "output": "text", "timeout": "soon"}),),
    )
    worker = procs.start("worker", "--name", "w-supervised")
    procs.start("executor")
    worker.wait_for_log("worker registered")
    with db.transaction():
        broken = request_execution(db, "t.broken", {"cmd": "true"})
    done = eventually(lambda: (s := _status(db, broken)) and s["status"] == "failed" and s, timeout=20,
                      message=procs.logs)  # fmt: skip
    assert "the worker failed running this action" in done["result"]["error"], done
    assert "ValueError" in done["result"]["error"], done
    assert worker.returncode is None, worker.logs()
    with db.transaction():
        fine = request_execution(db, "core.echo", {"message": "still here"})
    eventually(lambda: (s := _status(db, fine)) and s["status"] == "completed", timeout=20, message=procs.logs)
