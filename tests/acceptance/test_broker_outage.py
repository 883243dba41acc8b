"""Acceptance: services started while RabbitMQ cannot be reached do their work.

The broker only rings doorbells; the database has every fact and every consumer polls it.
So an executor and a worker started during a broker outage (here: a broker URL nothing
listens on) must schedule, run and finish executions -- more slowly -- and the worker
must heartbeat all along rather than sit registered and silent until the executors
declare it dead (found by the chaos suite: a worker started during a broker restart was
declared dead after the staleness threshold, and its work handed back).
"""

from __future__ import annotations

import socket
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, eventually, stays
from conveyor.sdk import request_executions

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again at once: nothing listens there


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(
        db_url,
        CONVEYOR__TRANSPORT="rabbitmq",
        CONVEYOR__MESSAGE_QUEUE__URL=f"amqp://guest:guest@127.0.0.1:{_unused_port()}/",
        CONVEYOR__RECOVERY__SWEEP_INTERVAL="0.2",
    )


def test_executor_and_worker_started_without_a_broker_run_executions(procs: Procs, db: Conn) -> None:
    executor = procs.start("executor")
    worker = procs.start("worker", "--name", "no-broker")
    executor.wait_for_log("executor started")
    worker.wait_for_log("worker registered")
    worker.wait_for_log("cannot reach RabbitMQ")
    with db.transaction():
        ids = request_executions(db, [("core.echo", {"message": f"m{i}"}) for i in range(5)])

    def finished() -> bool:
        rows = db.execute("SELECT status FROM execution WHERE id = ANY(%s)", (ids,)).fetchall()
        return [r["status"] for r in rows] == ["completed"] * len(ids)

    eventually(finished, timeout=30, message=procs.logs)

    def worker_alive() -> bool:
        row = db.execute(
            "SELECT status, now() - last_heartbeat < make_interval(secs => stale_after) AS fresh"
            " FROM worker WHERE name = 'no-broker'"
        ).fetchone()
        return row is not None and row["status"] == "active" and bool(row["fresh"])

    # Past the staleness threshold (heartbeat 1 s x 3): still active, never declared dead.
    stays(worker_alive, duration=4.0, message="the worker stopped heartbeating without a broker")
    assert "marking as inactive" not in executor.stderr() + executor.stdout()
    assert executor.returncode is None
    assert worker.returncode is None
