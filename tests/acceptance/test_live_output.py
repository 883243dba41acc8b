"""Acceptance: live output (issue #15). What a running execution prints reaches the database
while it runs, `conveyor executions tail` shows it (and follows it to the end), and a worker
SIGKILLed mid-run leaves what it had sent. Real processes, real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import CONVEYOR, Procs, conveyor_env, describe, eventually
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]

ACTIONS = """
import os, time
from conveyor import action
from conveyor.actions.context import current


@action("live.talk")
def talk(gate: str) -> str:
    ctx = current()
    ctx.log("before the gate")
    while not os.path.exists(gate):
        time.sleep(0.02)
    ctx.log("after the gate: caf\\u00e9")
    return "done"
"""


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, worker__output_interval=0.05)


def stored(db: Db, eid: int, stream: str) -> bytes:
    row = db.execute(
        "SELECT coalesce(string_agg(data, ''::bytea ORDER BY id), ''::bytea) AS data FROM execution_output"
        " WHERE execution = %s AND stream = %s",
        (eid, stream),
    ).fetchone()
    assert row is not None
    return bytes(row["data"])


def test_output_is_stored_while_running_and_survives_the_worker_being_killed(
    procs: Procs, db: Db, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    procs.start("executor", name="executor").wait_for_log("executor started")
    worker = procs.start("worker", name="worker")
    worker.wait_for_log("worker registered")
    # A NUL and a byte that is not UTF-8: stored as they are, shown escaped on a terminal.
    command = f"printf 'first\\n'; printf 'oops \\0 \\351\\n' >&2; while [ ! -e {gate} ]; do sleep 0.05; done"
    eid = request_execution(db, "core.local", {"cmd": command})

    eventually(lambda: stored(db, eid, "stdout") == b"first\n" and stored(db, eid, "stderr") == b"oops \x00 \xe9\n",
               timeout=30, message=procs.logs)  # fmt: skip
    assert db.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone() == {"status": "running"}
    shown = subprocess.run([*CONVEYOR, "executions", "tail", str(eid)], env=procs.env, capture_output=True, timeout=60)
    assert shown.returncode == 0, shown
    assert (shown.stdout, shown.stderr) == (b"first\n", b"oops \x00 \xe9\n")  # piped: the exact bytes

    worker.kill()  # SIGKILL, mid-run: what it had sent stays
    lines = [json.loads(x) for x in procs.run("executions", "tail", str(eid), "--json").stdout.splitlines()]
    shape = [(c["attempt"], c["stream"], c["encoding"]) for c in lines]
    assert shape == [(1, "stdout", "utf-8"), (1, "stderr", "base64")]
    assert lines[0]["data"] == "first\n"
    assert stored(db, eid, "stdout") == b"first\n"
    later = procs.run("executions", "tail", str(eid), "--json", "--after", str(lines[0]["id"]))
    assert [json.loads(x)["stream"] for x in later.stdout.splitlines()] == ["stderr"]


def test_tail_follows_a_python_actions_log_lines_to_the_end(
    procs: Procs, env: dict[str, str], db: Db, tmp_path: Path
) -> None:
    (tmp_path / "livemod.py").write_text(ACTIONS)
    env = {**env, "PYTHONPATH": f"{tmp_path}:{env.get('PYTHONPATH', '')}"}
    procs.start("executor", name="executor", env=env).wait_for_log("executor started")
    procs.start("worker", "--import", "livemod", name="worker", env=env).wait_for_log("worker registered")
    gate = tmp_path / "gate"
    eid = request_execution(db, "live.talk", {"gate": str(gate)})
    eventually(lambda: stored(db, eid, "log") == b"before the gate\n", timeout=30, message=procs.logs)

    follower = subprocess.Popen([*CONVEYOR, "executions", "tail", str(eid), "--follow"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        gate.touch()
        out, err = follower.communicate(timeout=30)  # it ends by itself when the execution does
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert (out, err) == ("", "before the gate\nafter the gate: café\n")
    assert db.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone() == {"status": "completed"}
    assert stored(db, eid, "stdout") == b""  # nothing printed: nothing stored


def test_tail_of_an_unknown_execution_is_one_line(procs: Procs) -> None:
    shown = procs.run("executions", "tail", "987654")
    assert shown.returncode == 1
    assert shown.stderr.strip().splitlines() == ["error: no execution with id 987654"], describe(shown)
