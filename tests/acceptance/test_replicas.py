"""Acceptance: the crash windows the seeds' HA plan names, hit exactly with failpoints
(conveyor/ops/failpoints.py: the process SIGKILLs itself at a named point), and duplicate
delivery of every message type, with real executor replicas and workers on both
transports. Assertions are about what the database records."""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, eventually
from acceptance.recovery_kit import RECOVERY_SETTINGS, start_executor, start_worker
from conveyor.sdk import request_execution
from conveyor.store.queries import Q
from conveyor.transport.messages import Names, encode

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]
TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}
SIGKILLED = -9


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **transport_env, CONVEYOR__EXECUTOR__CLAIM_TIMEOUT="2")


def request(db: Conn, n: int, ref: str = "core.noop", parameters: dict[str, Any] | None = None) -> list[int]:
    return [request_execution(db, ref, parameters or {}) for _ in range(n)]


def all_completed(procs: Procs, db: Conn, ids: list[int], timeout: float = 40) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        rows = db.execute("SELECT id, status FROM execution WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
        return rows if all(r["status"] in TERMINAL for r in rows) else None

    rows: list[dict[str, Any]] = eventually(done, timeout=timeout, message=procs.logs)
    assert [r["status"] for r in rows] == ["completed"] * len(ids), rows
    return rows


def attempt_counts(db: Conn, ids: list[int]) -> dict[int, int]:
    rows = db.execute(
        "SELECT execution, count(*)::int AS n FROM execution_attempt WHERE execution = ANY(%s) GROUP BY execution",
        (ids,),
    ).fetchall()
    return {r["execution"]: r["n"] for r in rows}


def test_executor_killed_after_claiming_is_taken_over(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """Claims committed (requested -> scheduling), nothing placed, the executor SIGKILLed:
    a replica reclaims them after executor.claim_timeout and each runs once."""
    start_worker(procs, env, "wa")
    doomed = start_executor(procs, env, CONVEYOR_FAILPOINTS="scheduler.after_claim")
    ids = request(db, 20)
    assert doomed.wait(30) == SIGKILLED
    stranded = db.execute("SELECT count(*)::int AS n FROM execution WHERE status = 'scheduling'").fetchone()
    assert stranded["n"] > 0
    start_executor(procs, env)
    all_completed(procs, db, ids)
    assert attempt_counts(db, ids) == dict.fromkeys(ids, 1)


def test_executor_killed_between_a_dispatch_and_its_message(
    procs: Procs, env: dict[str, str], db: Conn, transport_kind: str
) -> None:
    """The dispatch (scheduling -> scheduled) is committed with its message -- an outbox
    row on RabbitMQ, a NOTIFY on PostgreSQL -- and the executor dies before publishing:
    the next relay publishes it, and each execution runs once, on its first attempt."""
    point = "relay.before_dispatch_publish" if transport_kind == "rabbitmq" else "scheduler.after_dispatch"
    start_worker(procs, env, "wa")
    doomed = start_executor(procs, env, CONVEYOR_FAILPOINTS=point)
    ids = request(db, 20)
    assert doomed.wait(30) == SIGKILLED
    if transport_kind == "rabbitmq":
        pending = db.execute("SELECT count(*)::int AS n FROM outbox WHERE execution IS NOT NULL").fetchone()
        assert pending["n"] > 0, "the crash was meant to leave dispatch messages unpublished"
    start_executor(procs, env)
    all_completed(procs, db, ids)
    assert attempt_counts(db, ids) == dict.fromkeys(ids, 1)
    # The last results' wake-ups are committed with them and relayed just after: all of them.
    eventually(lambda: db.execute("SELECT count(*)::int AS n FROM outbox").fetchone()["n"] == 0, timeout=10,
               message=procs.logs)  # fmt: skip


def test_worker_killed_inside_the_result_that_releases_a_slot(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """Concurrency 1: the worker dies inside the transaction that records the holder's
    result, releases its slot and admits the next. All of it is rolled back together:
    the holder is recovered and run again, then the others run one at a time in order."""
    db.execute(Q["set_policy"], {"target": "core.sleep", "concurrency": 1, "parameters": [], "method": "enqueue"})
    # The recovered holder waits for the second worker rather than failing "no workers".
    start_executor(procs, env, CONVEYOR__EXECUTOR__NO_WORKER_GRACE=30)
    doomed = start_worker(procs, env, "wa", CONVEYOR_FAILPOINTS="worker.before_result_commit")
    ids = request(db, 4, "core.sleep", {"seconds": 0.3})
    assert doomed.wait(30) == SIGKILLED
    first = db.execute("SELECT status, worker FROM execution WHERE id = %s", (ids[0],)).fetchone()
    assert first["status"] in ("running", "requested")  # still running on the dead worker, or recovered
    slots = db.execute("SELECT execution FROM execution_admission_slot").fetchall()
    assert [r["execution"] for r in slots] == [ids[0]], "the slot went with an uncommitted result"
    start_worker(procs, env, "wb")
    all_completed(procs, db, ids)
    runs = db.execute(
        "SELECT execution, attempt, worker_name, started, ended, outcome FROM execution_attempt "
        "WHERE execution = ANY(%s) ORDER BY started",
        (ids,),
    ).fetchall()
    assert [(r["execution"], r["worker_name"]) for r in runs] == [
        (ids[0], "wa"), (ids[0], "wb"), (ids[1], "wb"), (ids[2], "wb"), (ids[3], "wb")
    ]  # fmt: skip
    finished = [r for r in runs if r["outcome"] == "completed"]
    for before, after in itertools.pairwise(finished):
        assert before["ended"] <= after["started"], "two executions of a concurrency-1 group ran at once"
    assert db.execute("SELECT count(*)::int AS n FROM execution_admission_slot").fetchone()["n"] == 0


def test_duplicates_of_every_message_change_nothing(
    procs: Procs, env: dict[str, str], db: Conn, transport_kind: str, db_url: str
) -> None:
    """While two executors and two workers run 150 executions, every message is delivered
    again and again: dispatches (to the right worker), requests, completions, capacity,
    and dead letters of dispatches. Each execution still runs once, on attempt 1."""
    for _ in range(2):
        start_executor(procs, env)
    for name in ("wa", "wb"):
        start_worker(procs, env, name)
    stop = threading.Event()
    sent: list[int] = []
    duplicator = threading.Thread(target=_duplicate, args=(env, db_url, transport_kind, stop, sent), daemon=True)
    duplicator.start()
    try:
        ids = request(db, 100) + request(db, 50, "core.sleep", {"seconds": 0.2})
        all_completed(procs, db, ids, timeout=60)
        eventually(lambda: sum(sent) > 50, timeout=20, message="the duplicator sent too little")
    finally:
        stop.set()
        duplicator.join(30)
    assert attempt_counts(db, ids) == dict.fromkeys(ids, 1)
    unresolved = db.execute("SELECT count(*)::int AS n FROM dead_letter WHERE resolution IS NULL").fetchone()
    assert unresolved["n"] == 0


def _duplicate(env: dict[str, str], db_url: str, kind: str, stop: threading.Event, sent: list[int]) -> None:
    """Re-send copies of what is in flight, every 50 ms, until stopped."""
    from conveyor.store.db import connect_sync

    with connect_sync(db_url, "conveyor", autocommit=True) as conn:
        while not stop.wait(0.05):
            rows = conn.execute(
                "SELECT id, attempt, worker, scheduled, status FROM execution WHERE worker IS NOT NULL "
                "AND status IN ('scheduled', 'running', 'completed') ORDER BY random() LIMIT 20"
            ).fetchall()
            if kind == "postgres":
                channels = ["conveyor.requested", "conveyor.completed", "conveyor.capacity"]
                channels += [f"conveyor.worker.{r['worker']}" for r in rows]
                conn.execute("SELECT pg_notify(c, '') FROM unnest(%s::text[]) AS c", (channels,))
            else:
                _publish_copies(env, rows)
            sent.append(len(rows))


def _publish_copies(env: dict[str, str], rows: list[dict[str, Any]]) -> None:
    from acceptance.mq import publish_raw

    names = Names(env["CONVEYOR__MESSAGE_QUEUE__PREFIX"], f"{env['CONVEYOR__MESSAGE_QUEUE__PREFIX']}.dlx")
    now = datetime.now(UTC)
    messages: list[tuple[str, str, bytes, dict[str, Any]]] = []
    ids = [r["id"] for r in rows]

    def message(exchange: str, key: str, kind: str, payload: dict[str, Any]) -> None:
        mid = str(uuid.uuid4())
        body = encode(mid, kind, payload, now)
        messages.append((exchange, key, body, {"message_id": mid, "type": kind, "content_type": "application/json"}))

    for r in rows:
        dispatch = {"execution_id": r["id"], "attempt": r["attempt"], "worker_id": r["worker"],
                    "scheduled": r["scheduled"].isoformat()}  # fmt: skip
        message(names.executions, f"execution.scheduled.worker.{r['worker']}", "execution.scheduled", dispatch)
        if r["status"] == "completed":
            # A dead letter again after the fact (a dead letter of a live dispatch would be
            # a different event -- an expiry -- not a duplicate).
            message(names.dlx, f"execution.scheduled.worker.{r['worker']}", "execution.scheduled", dispatch)
    message(names.executions, "execution.requested", "execution.requested", {"execution_ids": ids})
    message(names.executions, "execution.completed", "execution.completed", {"execution_ids": ids})
    message(names.executions, "worker.capacity", "worker.capacity", {"worker_ids": []})
    publish_raw(env["CONVEYOR__MESSAGE_QUEUE__URL"], messages)
