"""Acceptance: a command running across a PostgreSQL outage (a private server: the shared
one is never touched) ends as docs/runbook.md says, and the worker's log says so before it
happens.

- An outage shorter than the time the worker has left before ``self_fence_after`` without
  a heartbeat (5 s here, with a 10 s heartbeat: always shorter): the command carries on,
  its result is written once the server is back, one run, ``attempt`` 1.
- A longer one (22 s: past ``self_fence_after``, 20 s by default, whatever the heartbeat's
  phase): the worker stops the command (``worker lost its standing``), and once the server
  is back the executors re-run it as attempt 2 (``on_worker_lost`` retry, the default);
  attempt 1 ends ``worker_lost``. Two runs, both recorded.

Before issue 25 the worker logged ``database restarting; the work carries on`` in both
cases and then killed the command in the second.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from acceptance.helpers import Procs, conveyor_env, eventually
from acceptance.netns import Forwarder
from acceptance.pg import PrivatePostgres
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance

HEARTBEAT = 10.0  # the default: self_fence_after 20 s, the executors' bound 30 s
TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}
CARRY_ON = "database restarting; running executions carry on if it is back within stops_in seconds"
STOPPED = "worker lost its standing; stopping its executions: the executors re-run them as a new attempt"


@pytest.fixture
def env(private_pg: PrivatePostgres) -> dict[str, str]:
    return conveyor_env(private_pg.url, CONVEYOR__WORKER__HEARTBEAT_INTERVAL=str(HEARTBEAT))


def _rows(url: str, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=3,
                         options="-c search_path=conveyor") as conn:  # fmt: skip
        return conn.execute(query, params).fetchall()


@pytest.mark.parametrize(("outage", "runs", "attempts"), [
    (5.0, 1, [(1, "completed")]),
    (22.0, 2, [(1, "worker_lost"), (2, "completed")]),
])  # fmt: skip
def test_a_command_running_across_an_outage_ends_as_the_runbook_says(
    private_pg: PrivatePostgres, procs: Procs, tmp_path: Path, outage: float, runs: int,
    attempts: list[tuple[int, str]],
) -> None:  # fmt: skip
    url = private_pg.url
    executor = procs.start("executor", name="executor")
    worker = procs.start("worker", "--name", "w1", name="worker")
    executor.wait_for_log("executor started", timeout=60)
    worker.wait_for_log("worker registered", timeout=60)

    def logs() -> str:
        return procs.logs() + "\n" + private_pg.logs()

    # Each run appends a line; the first lasts longer than the outage, a second is quick.
    record = tmp_path / "runs.txt"
    cmd = f'echo run >> {record}; [ "$(wc -l < {record})" -gt 1 ] || sleep {outage + 8:g}; echo done'
    with psycopg.connect(url, autocommit=True, row_factory=dict_row, options="-c search_path=conveyor") as conn:
        eid = request_execution(conn, "core.local", {"cmd": cmd})
    eventually(lambda: record.exists() and _rows(url, "SELECT status FROM execution WHERE id = %s", (eid,))[0][
        "status"] == "running", timeout=30, message=logs)  # fmt: skip

    private_pg.stop("fast")
    down = time.monotonic()
    while time.monotonic() - down < outage:
        time.sleep(0.1)
    private_pg.start()

    def ended() -> dict[str, Any] | None:
        row = _rows(url, "SELECT status, attempt FROM execution WHERE id = %s", (eid,))[0]
        return row if row["status"] in TERMINAL else None

    row = eventually(ended, timeout=outage + 60, interval=0.2, message=logs)
    assert row == {"status": "completed", "attempt": attempts[-1][0]}, logs()
    recorded = _rows(url, "SELECT attempt, outcome FROM execution_attempt WHERE execution = %s ORDER BY attempt",
                     (eid,))  # fmt: skip
    assert [(a["attempt"], a["outcome"]) for a in recorded] == attempts, logs()
    assert record.read_text().splitlines() == ["run"] * runs, logs()

    # The log said what would happen, then it happened.
    said = worker.stderr()
    assert CARRY_ON in said, worker.logs()
    if runs == 1:
        assert "worker lost its standing" not in said, worker.logs()
    else:
        assert said.index(CARRY_ON) < said.index(STOPPED), worker.logs()
        assert "no heartbeat for" in said, worker.logs()
    for proc in (executor, worker):
        assert proc.returncode is None, proc.logs()
        assert "Traceback" not in proc.stderr(), proc.logs()


def test_a_result_finished_in_an_outage_longer_than_the_threshold_is_written(
    private_pg: PrivatePostgres, procs: Procs, tmp_path: Path
) -> None:
    """The server is down 35 s, longer than the executors' bound (30 s) whatever the
    heartbeat's phase; the command ends 2 s into the outage, its result waits in the
    worker, which reaches the server again 3 s after the executors do. Nobody could have
    recovered anything while the server was down: the result is written, one run,
    attempt 1. (Before, the executors declared the worker dead the moment the server was
    back, refused its result and ran the command again.)"""
    url = private_pg.url
    with Forwarder("127.0.0.1", ("127.0.0.1", private_pg.port)) as forwarder:
        via = make_conninfo(url, host=forwarder.host, port=str(forwarder.port))
        executor = procs.start(
            "executor", name="executor", env={**procs.env, "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2"}
        )
        worker = procs.start("worker", "--name", "w1", name="worker", env={**procs.env, "DATABASE_URL": via})
        executor.wait_for_log("executor started", timeout=60)
        worker.wait_for_log("worker registered", timeout=60)

        def logs() -> str:
            return procs.logs() + "\n" + private_pg.logs()

        record = tmp_path / "runs.txt"
        with psycopg.connect(url, autocommit=True, row_factory=dict_row, options="-c search_path=conveyor") as conn:
            eid = request_execution(conn, "core.local", {"cmd": f"echo run >> {record}; sleep 2; echo done"})
        eventually(lambda: record.exists(), timeout=30, message=logs)

        private_pg.stop("fast")
        down = time.monotonic()
        while time.monotonic() - down < 35.0:
            time.sleep(0.1)
        forwarder.closing.set()  # the worker gets through only 3 s after the executor
        private_pg.start()
        back = time.monotonic()
        while time.monotonic() - back < 3.0:
            time.sleep(0.1)
        forwarder.closing.clear()

        def ended() -> dict[str, Any] | None:
            row = _rows(url, "SELECT status, attempt FROM execution WHERE id = %s", (eid,))[0]
            return row if row["status"] in TERMINAL else None

        row = eventually(ended, timeout=60, interval=0.2, message=logs)
        assert row == {"status": "completed", "attempt": 1}, logs()
        assert record.read_text().splitlines() == ["run"], logs()
        assert "marking as inactive" not in executor.stderr(), executor.logs()
        for proc in (executor, worker):
            assert proc.returncode is None, proc.logs()
            assert "Traceback" not in proc.stderr(), proc.logs()
