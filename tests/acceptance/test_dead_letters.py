"""The seeds' manual DLQ test, automated, on both transports: workers stop taking work,
the dispatch expires after a short worker queue TTL, the execution is resolved as
specified and the dead letter is recorded -- by real executor and worker processes.

"Stopped" is SIGSTOP: the process holds its liveness lock and its heartbeat is still
fresh, so it is dispatched to, but it takes nothing -- exactly the case a queue TTL is
for. (A worker that dies is found by its released lock in about a second instead; see
test_worker_crashes.py.)
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Proc, Procs, conveyor_env, eventually
from conveyor.sdk import request_execution
from conveyor.store.queries import Q

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]
EXPIRED = "Message expired in worker queue (worker unavailable)"

# TTL 1 s, staleness 15 s (heartbeat 5 s x 3): the dispatch expires long before the
# stopped worker could be declared dead.
SETTINGS = {
    "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_TTL_MS": "1000",
    # A stopped worker holds what RabbitMQ already pushed to it, unacknowledged (a TTL does
    # not expire those): the broker takes them back when its heartbeat goes unanswered.
    "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__HEARTBEAT": "1",
    "CONVEYOR__DEAD_LETTER__CHECK_INTERVAL": "0.2",
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": "5",
    "CONVEYOR__EXECUTOR__POLL_INTERVAL": "0.2",
    "CONVEYOR__EXECUTOR__NO_WORKER_GRACE": "60",
}


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    return conveyor_env(db_url, **SETTINGS, **transport_env)


def start(procs: Procs, env: dict[str, str], role: str, name: str, **overrides: object) -> Proc:
    args = ("worker", "--name", name) if role == "worker" else ("executor",)
    proc = procs.start(*args, name=name, env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("worker registered" if role == "worker" else "executor started")
    return proc


def execution(db: Conn, eid: int) -> dict[str, Any]:
    found = db.execute(Q["get_execution"], {"id": eid}).fetchone()
    assert found is not None
    return dict(found)


def letters(db: Conn) -> list[dict[str, Any]]:
    return [dict(r) for r in db.execute("SELECT * FROM dead_letter ORDER BY id").fetchall()]


def outcomes(db: Conn, eid: int) -> list[tuple[int, str, str | None]]:
    rows = db.execute(Q["get_attempts"], {"id": eid}).fetchall()
    return [(a["attempt"], a["worker_name"], a["outcome"]) for a in rows]


def test_all_workers_stopped_dispatch_expires_and_fails(
    procs: Procs, env: dict[str, str], db: Conn, transport_kind: str
) -> None:
    executor = start(procs, env, "executor", "executor", CONVEYOR__EXECUTOR__SCHEDULED_TIMEOUT_RESCHEDULES=0)
    worker = start(procs, env, "worker", "w-stopped")
    worker.signal(signal.SIGSTOP)
    try:
        eid = request_execution(db, "core.echo", {"message": "test"})
        done = eventually(lambda: (e := execution(db, eid))["status"] == "failed" and e, timeout=20,
                          message=procs.logs)  # fmt: skip
    finally:
        worker.signal(signal.SIGCONT)
    assert done["result"]["error"] == EXPIRED
    assert done["result"]["failed_by"] == "dead_letter_handler"
    assert outcomes(db, eid) == [(1, "w-stopped", "expired")]
    (letter,) = letters(db)
    assert letter["transport"] == transport_kind
    assert letter["reason"] == "expired"
    assert letter["resolution"] == "failed"
    assert letter["execution"] == eid
    assert letter["attempt"] == 1
    assert letter["queue"].endswith(f".worker.{done['worker']}.executions")
    assert letter["payload"]["message_type"] == "execution.scheduled"
    assert letter["payload"]["payload"]["execution_id"] == eid
    executor.wait_for_log("dead letter handled")
    # The user sees it too.
    listed = procs.json("executions", "get", str(eid))
    assert listed["status"] == "failed"


def test_expired_dispatch_is_rescheduled_on_a_worker_that_takes_it(
    procs: Procs, env: dict[str, str], db: Conn, transport_kind: str
) -> None:
    start(procs, env, "executor", "executor")  # default: one reschedule, then fail
    stopped = start(procs, env, "worker", "w-a-stopped")  # registered first: the lowest id wins ties
    start(procs, env, "worker", "w-b-healthy")
    stopped.signal(signal.SIGSTOP)
    try:
        eid = request_execution(db, "core.echo", {"message": "second chance"})
        done = eventually(lambda: (e := execution(db, eid))["status"] == "completed" and e, timeout=20,
                          message=procs.logs)  # fmt: skip
    finally:
        stopped.signal(signal.SIGCONT)
    assert done["result"]["data"] == "second chance"
    assert outcomes(db, eid) == [(1, "w-a-stopped", "expired"), (2, "w-b-healthy", "completed")]
    (letter,) = letters(db)
    assert (letter["reason"], letter["resolution"], letter["transport"]) == ("expired", "rescheduled", transport_kind)
