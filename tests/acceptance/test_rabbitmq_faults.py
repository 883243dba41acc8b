"""Acceptance: the RabbitMQ transport under faults, with real ``conveyor`` processes
against a real broker and a real PostgreSQL. Each test has its own name prefix (its own
exchanges and queues); assertions are about what the database and ``rabbitmqctl`` say.

1. The topology declared follows the configuration given in the environment.
2. Malformed messages (not JSON, unknown type, a dispatch missing its fields) sent to the
   executors' and a worker's queue become ``rejected``/``invalid`` dead letters, are
   acknowledged, and harm nothing; so do bodies PostgreSQL cannot store as they are (NUL,
   NaN, infinities).
3. The broker restarted under load: every execution completes exactly once, the outbox
   drains, every process reconnects.
4. The processes' broker connections killed under load: the same; and after each loss
   of a healthy session the reconnection is prompt (the backoff starts over).
5. A worker's queue keeps its name across restarts under the same worker name, and the
   queue of a worker gone for good is removed by its ``x-expires``.
6. The relay dies (SIGKILL of the only executor) while workers keep writing to the outbox:
   a new executor publishes what piled up and everything completes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from acceptance import mq
from acceptance.helpers import Proc, Procs, conveyor_env, describe, eventually, stays, until
from conveyor.sdk import request_executions
from support.polling import GiveUp

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}
MQ_SETTINGS = {
    "CONVEYOR__TRANSPORT": "rabbitmq",
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    # Reconciler every 2 s: a message lost with a connection costs little.
    "CONVEYOR__MESSAGE_QUEUE__RECONCILE_AFTER": "4",
}
CONNECTED = "connected to RabbitMQ"
LOST = "RabbitMQ connection lost; reconnecting"


@pytest.fixture(scope="session")
def broker_ctl() -> None:
    problem = mq.rabbitmqctl_problem()
    if problem:
        if IN_CI:
            pytest.fail(f"{problem} (CI=true: a missing service fails the run)")
        pytest.skip(problem)


@pytest.fixture
def env(db_url: str, rabbitmq_url: str, mq_prefix: str, broker_ctl: None) -> dict[str, str]:
    return conveyor_env(
        db_url,
        **MQ_SETTINGS,
        CONVEYOR__MESSAGE_QUEUE__URL=rabbitmq_url,
        CONVEYOR__MESSAGE_QUEUE__PREFIX=mq_prefix,
    )


# -- helpers ------------------------------------------------------------------------------


def start_executor(procs: Procs, env: dict[str, str], label: str = "executor", **overrides: object) -> Proc:
    proc = procs.start("executor", name=label, env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("executor started")
    proc.wait_for_log(CONNECTED)
    return proc


def start_worker(
    procs: Procs, env: dict[str, str], name: str | None, label: str | None = None, **overrides: object
) -> Proc:
    """A worker named ``name`` (None: by CONVEYOR__WORKER__NAME in the environment)."""
    args = ("worker", "--name", name) if name else ("worker",)
    proc = procs.start(*args, name=label or f"worker-{name}", env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("worker registered")
    proc.wait_for_log(CONNECTED)
    return proc


def worker_id(db: Conn, name: str) -> int:
    row = db.execute("SELECT id FROM worker WHERE name = %s", (name,)).fetchone()
    assert row is not None, name
    return int(row["id"])


def outbox_depth(db: Conn) -> int:
    row = db.execute("SELECT count(*) AS n FROM outbox").fetchone()
    assert row is not None
    return int(row["n"])


def statuses(db: Conn, ids: list[int]) -> dict[str, int]:
    rows = db.execute(
        "SELECT status, count(*) AS n FROM execution WHERE id = ANY(%s) GROUP BY status ORDER BY status", (ids,)
    ).fetchall()
    return {r["status"]: int(r["n"]) for r in rows}


def all_terminal(db: Conn, ids: list[int]) -> Callable[[], bool]:
    return lambda: sum(n for s, n in statuses(db, ids).items() if s in TERMINAL) == len(ids)


def assert_completed_exactly_once(db: Conn, ids: list[int]) -> None:
    """Every execution completed, with exactly one attempt, which completed."""
    rows = db.execute(
        """
        SELECT e.id, e.status, e.attempt, count(a.attempt) AS attempts,
               count(a.attempt) FILTER (WHERE a.outcome = 'completed') AS completed,
               array_remove(array_agg(a.outcome ORDER BY a.attempt), NULL) AS outcomes
        FROM execution e LEFT JOIN execution_attempt a ON a.execution = e.id
        WHERE e.id = ANY(%s) GROUP BY e.id ORDER BY e.id
        """,
        (ids,),
    ).fetchall()
    assert len(rows) == len(ids)
    wrong = [
        dict(r) for r in rows if (r["status"], r["attempt"], r["attempts"], r["completed"]) != ("completed", 1, 1, 1)
    ]
    assert not wrong, f"{len(wrong)} executions not completed exactly once, e.g. {wrong[:5]}"


def dead_letters(db: Conn) -> list[dict[str, Any]]:
    return [dict(r) for r in db.execute("SELECT * FROM dead_letter ORDER BY id").fetchall()]


def assert_no_work_dead_lettered(db: Conn) -> None:
    """No dead letter moved or failed an execution (nothing expired or looped in a worker
    queue), and none is left pending."""
    moved = [d for d in dead_letters(db) if d["resolution"] in ("rescheduled", "failed") or d["resolution"] is None]
    assert not moved, moved


def log_count(proc: Proc, text: str) -> int:
    return (proc.stderr() + proc.stdout()).count(text)


def wait_log_count(proc: Proc, text: str, more_than: int, timeout: float = 30.0) -> None:
    """Until ``text`` was logged more than ``more_than`` times; fail at once if the process exits."""

    def logged_again() -> bool:
        if log_count(proc, text) > more_than:
            return True
        if proc.returncode is not None:
            raise GiveUp(f"{proc.name} exited before logging {text!r} again\n{proc.logs()}")
        return False

    eventually(
        logged_again,
        timeout,
        0.05,
        lambda: f"{proc.name} did not log {text!r} again within {timeout:g}s\n{proc.logs()}",
    )


def consumed(prefix: str, *names: str) -> Callable[[], dict[str, dict[str, int]] | None]:
    """The queues, once each named one exists and has a consumer."""

    def check() -> dict[str, dict[str, int]] | None:
        found = mq.live_queues(prefix)
        return found if all(n in found and found[n]["consumers"] >= 1 for n in names) else None

    return check


def queues_empty(prefix: str) -> Callable[[], dict[str, int] | None]:
    """The depths, once every ``prefix.*`` queue holds nothing, acknowledged or not."""

    def check() -> dict[str, int] | None:
        found = mq.depths(prefix)
        return found if found and not any(found.values()) else None

    return check


def echo_completes(procs: Procs, message: str, timeout: float = 30) -> dict[str, Any]:
    done = procs.run("run", "core.echo", f"message={message}", "--wait", "--json", timeout=timeout)
    assert done.returncode == 0, describe(done) + "\n" + procs.logs()
    result = json.loads(done.stdout)
    assert result["status"] == "completed", result
    return dict(result)


# -- 1. configuration from the environment reaches the broker ---------------------------------


def test_declared_topology_follows_the_environment(procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str) -> None:
    env = {
        **env,
        "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_TTL_MS": "4321",
        "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_EXPIRES_MS": "654321",
        "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__DELIVERY_LIMIT": "7",
        "CONVEYOR__DEAD_LETTER__TTL_MS": "98765",
    }
    procs.env = env
    executor = start_executor(procs, env)
    worker = start_worker(procs, env, "w1")
    wid = worker_id(db, "w1")
    p = mq_prefix
    wq, rq, dlq = f"{p}.worker.{wid}.executions", f"{p}.executor.requests", f"{p}.dlx.queue"

    assert set(until(procs, consumed(p, wq, rq, dlq), timeout=30, interval=0.2)) == {wq, rq, dlq}
    found = mq.queues(p)
    assert set(found) == {wq, rq, dlq}, found
    assert found[wq]["arguments"] == {
        "x-queue-type": "quorum",
        "x-message-ttl": 4321,
        "x-expires": 654321,
        "x-delivery-limit": 7,
        "x-dead-letter-exchange": f"{p}.dlx",
    }
    assert found[rq]["arguments"] == {
        "x-queue-type": "quorum",
        "x-delivery-limit": 7,
        "x-dead-letter-exchange": f"{p}.dlx",
    }
    assert found[dlq]["arguments"] == {"x-queue-type": "quorum", "x-message-ttl": 98765}
    assert {q["type"] for q in found.values()} == {"quorum"}
    assert mq.exchanges(p) == {f"{p}.executions": "topic", f"{p}.events": "topic", f"{p}.dlx": "fanout"}

    bindings = mq.bindings(p)
    assert {
        (f"{p}.executions", rq, "execution.requested"),
        (f"{p}.executions", rq, "worker.capacity"),
        (f"{p}.executions", wq, f"execution.scheduled.worker.{wid}"),
        (f"{p}.dlx", dlq, ""),
    } <= bindings, bindings

    # Connections say who they are.
    names = {c["connection_name"] for c in mq.connections_of([executor.pid, worker.pid])}
    assert names == {"conveyor-executor-listen", "conveyor-worker-listen"}, names

    # And the topology carries work.
    echo_completes(procs, "topology")
    assert until(procs, queues_empty(p), timeout=20, interval=0.2)


# -- 2. malformed messages are dead-lettered as invalid, and harm nothing ----------------------


def test_malformed_messages_become_invalid_dead_letters(
    procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str, rabbitmq_url: str
) -> None:
    executor = start_executor(procs, env)
    worker = start_worker(procs, env, "w1")
    wid = worker_id(db, "w1")
    p = mq_prefix
    wq, rq = f"{p}.worker.{wid}.executions", f"{p}.executor.requests"
    until(procs, consumed(p, wq, rq, f"{p}.dlx.queue"), timeout=30, interval=0.2)

    unknown_type = json.dumps({"message_id": "x", "message_type": "execution.exploded", "payload": {}}).encode()
    half_dispatch = json.dumps(
        {"message_id": "y", "message_type": "execution.scheduled", "payload": {"execution_id": 4242}}
    ).encode()
    sent = {
        # message id: (exchange, routing key, body, queue it reaches)
        "bad-requested-bytes": (f"{p}.executions", "execution.requested", b"\xff\xfenot json{", rq),
        "bad-requested-type": (f"{p}.executions", "execution.requested", unknown_type, rq),
        "bad-worker-bytes": ("", wq, b"garbage, not an envelope", wq),
        "bad-worker-type": ("", wq, unknown_type, wq),
        "bad-worker-dispatch": (f"{p}.executions", f"execution.scheduled.worker.{wid}", half_dispatch, wq),
    }
    mq.publish_raw(
        rabbitmq_url,
        [
            (ex, key, body, {"message_id": mid, "content_type": "application/octet-stream"})
            for mid, (ex, key, body, _) in sent.items()
        ],
    )

    def recorded() -> dict[str, dict[str, Any]] | None:
        rows = {d["message_id"]: d for d in dead_letters(db)}
        return rows if set(sent) <= set(rows) and all(rows[m]["resolution"] for m in sent) else None

    rows = until(procs, recorded, timeout=30)
    assert set(rows) == set(sent), rows.keys()
    for mid, (_, key, body, queue) in sent.items():
        row = rows[mid]
        assert (row["transport"], row["reason"], row["resolution"], row["queue"], row["routing_key"]) == (
            "rabbitmq",
            "rejected",
            "invalid",
            queue,
            key,
        ), row
        assert row["error"], row  # why it was rejected
        assert (row["attempt"], row["worker"]) == (None, None), row
        assert row["execution"] == (4242 if mid == "bad-worker-dispatch" else None), row
        assert row["deliveries"] == 1, row
        if body.startswith(b"{"):
            assert row["payload"] == json.loads(body), row
        else:
            assert row["payload"] == {"raw": body.decode("utf-8", "replace")}, row
    assert "not JSON" in rows["bad-requested-bytes"]["error"]
    assert "execution.exploded" in rows["bad-requested-type"]["error"]
    assert "execution.scheduled needs" in rows["bad-worker-dispatch"]["error"]

    # Acknowledged everywhere: nothing left in any queue, nothing redelivered.
    assert until(procs, queues_empty(p), timeout=20, interval=0.2)
    stays(lambda: len(dead_letters(db)) == len(sent), 1.0, message="a malformed message was redelivered")

    # The service is unharmed.
    echo_completes(procs, "still fine")
    assert [executor.returncode, worker.returncode] == [None, None], procs.logs()
    assert [log_count(executor, LOST), log_count(worker, LOST)] == [0, 0], procs.logs()
    executor.wait_for_log("invalid message dead-lettered")
    worker.wait_for_log("invalid message dead-lettered")


def _unstorable_bodies_become_invalid_dead_letters(
    procs: Procs, env: dict[str, str], db: Conn, prefix: str, url: str, bodies: dict[str, bytes]
) -> None:
    executor = start_executor(procs, env)
    until(procs, consumed(prefix, f"{prefix}.executor.requests", f"{prefix}.dlx.queue"), timeout=30, interval=0.2)
    mq.publish_raw(
        url,
        [(f"{prefix}.executions", "execution.requested", body, {"message_id": mid}) for mid, body in bodies.items()],
    )

    def recorded() -> dict[str, dict[str, Any]] | None:
        rows = {d["message_id"]: d for d in dead_letters(db) if d["message_id"] in bodies}
        return rows if len(rows) == len(bodies) and all(r["resolution"] for r in rows.values()) else None

    rows = until(procs, recorded, timeout=10, interval=0.1)
    outcomes = {mid: (r["reason"], r["resolution"]) for mid, r in rows.items()}
    assert outcomes == dict.fromkeys(bodies, ("rejected", "invalid")), rows
    assert until(procs, queues_empty(prefix), timeout=20, interval=0.2)
    assert executor.returncode is None


def test_bodies_postgresql_cannot_store_become_invalid_dead_letters(
    procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str, rabbitmq_url: str
) -> None:
    """text and jsonb hold no NUL, jsonb no NaN or Infinity (which Python's json reads and
    writes): such bodies are still recorded and acknowledged, never left in the DLQ."""
    bodies = {
        "nul-bytes": b"\x00binary\x00",
        "nul-json": b'{"message_type": "\\u0000"}',
        "nan-json": b'{"message_type": "execution.exploded", "n": NaN}',
        "inf-json": b'{"message_type": "execution.requested", "payload": {"execution_ids": [-Infinity]}}',
    }
    _unstorable_bodies_become_invalid_dead_letters(procs, env, db, mq_prefix, rabbitmq_url, bodies)


# -- 3 and 4. the broker restarted, connections killed, under load ------------------------------


# Sleeps of 0.25 s on 2 x 10 slots: a batch of 200 keeps the workers busy for 2.5 s at
# least, so the fault (which takes rabbitmqctl a second or two) hits work in flight.
LOAD = ("core.sleep", {"seconds": 0.25})


def _under_load(procs: Procs, env: dict[str, str], db: Conn) -> tuple[list[Proc], list[int]]:
    executor = start_executor(procs, env)
    workers = [start_worker(procs, env, name) for name in ("w1", "w2")]
    ids = request_executions(db, [LOAD] * 200)
    until(procs, lambda: statuses(db, ids).get("completed", 0) >= 10)
    return [executor, *workers], ids


def in_flight(db: Conn, ids: list[int]) -> int:
    return sum(n for s, n in statuses(db, ids).items() if s not in TERMINAL)


def _assert_recovered(procs: Procs, db: Conn, prefix: str, group: list[Proc], ids: list[int], before: int) -> None:
    until(procs, all_terminal(db, ids), timeout=90, interval=0.2)
    assert_completed_exactly_once(db, ids)
    assert statuses(db, ids) == {"completed": len(ids)}
    # Nothing waits to be published, nothing is left in a queue.
    until(procs, lambda: outbox_depth(db) == 0, timeout=30, interval=0.2)
    until(procs, queues_empty(prefix), timeout=30, interval=0.2)
    assert_no_work_dead_lettered(db)
    # Every process is alive and connected again, on its own.
    for proc in group:
        assert proc.returncode is None, proc.logs()
        assert log_count(proc, LOST) >= 1, proc.logs()
        wait_log_count(proc, CONNECTED, before)
    live = mq.connections_of([p.pid for p in group])
    assert len(live) == len(group), live
    # And they carry new work.
    echo_completes(procs, "after")


def test_broker_restart_under_load(procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str) -> None:
    group, ids = _under_load(procs, env, db)
    executor = group[0]
    with mq.broker_stopped():
        assert in_flight(db, ids) > 0, "the broker stopped after the work was done: no load to test"
        for proc in group:
            proc.wait_for_log(LOST, timeout=30)
        # Requests go on while the broker is away (they are rows and NOTIFYs), and so
        # does the work: the database is the source of truth, messages are wake-ups.
        more = request_executions(db, [("core.noop", {})] * 100)
        ids += more
        until(procs, lambda: statuses(db, more).get("completed", 0) >= 10, timeout=30)
        # The messages of those state changes wait in the outbox.
        until(procs, lambda: outbox_depth(db) > 0, timeout=10)
        stays(lambda: outbox_depth(db) > 0, 1.0, message="the outbox drained with no broker")
        assert log_count(executor, CONNECTED) == 1
        ids += request_executions(db, [LOAD] * 200)  # the broker returns while these run
    _assert_recovered(procs, db, mq_prefix, group, ids, before=1)


def test_connections_killed_under_load(procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str) -> None:
    group, ids = _under_load(procs, env, db)
    pids = [p.pid for p in group]
    for round_ in (1, 2):
        connections = mq.connections_of(pids)
        assert sorted(c["connection_name"] for c in connections) == [
            "conveyor-executor-listen",
            "conveyor-worker-listen",
            "conveyor-worker-listen",
        ], connections
        ids += request_executions(db, [LOAD] * 200)
        closed = mq.close_connections(connections, "test: connection killed")
        assert in_flight(db, ids) > 0, "the connections died after the work was done: no load to test"
        assert len(closed) == len(group), closed
        for proc in group:
            wait_log_count(proc, CONNECTED, round_)
    _assert_recovered(procs, db, mq_prefix, group, ids, before=2)
    assert not set(closed) & {c["name"] for c in mq.connections_of(pids)}, "new connections, not the old ones"


def test_each_connection_loss_is_followed_by_a_prompt_reconnect(procs: Procs, env: dict[str, str]) -> None:
    executor = start_executor(procs, env)
    for round_ in range(1, 6):
        connections = mq.connections_of([executor.pid])
        assert len(connections) == 1, connections
        assert mq.close_connections(connections, "test: connection killed") == [connections[0]["name"]]
        closed_at = time.monotonic()
        wait_log_count(executor, CONNECTED, round_)
        took = time.monotonic() - closed_at
        assert took < 2.0, f"reconnection {round_} took {took:.1f}s after a healthy session"
        # A healthy session for a while: the next loss should start the backoff afresh.
        stays(lambda n=round_: executor.returncode is None and log_count(executor, LOST) == n, 0.5)


# -- 5. a worker's queue: same name across restarts, removed when the worker is gone --------


def test_worker_queue_survives_restart_and_expires_when_gone(
    procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str
) -> None:
    env = {
        **env,
        "CONVEYOR__WORKER__NAME": "fixed",
        "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_TTL_MS": "1000",
        "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_EXPIRES_MS": "3000",
    }
    procs.env = env
    start_executor(procs, env)
    first = start_worker(procs, env, None, label="worker-fixed-1")
    wid = worker_id(db, "fixed")
    queue = f"{mq_prefix}.worker.{wid}.executions"
    until(procs, consumed(mq_prefix, queue), timeout=30, interval=0.2)
    assert echo_completes(procs, "one")["worker_name"] == "fixed"

    first.signal(signal.SIGTERM)
    assert first.wait(15) == 0, first.logs()
    # The worker leaves its queue behind (a restart finds it), unconsumed.
    assert mq.live_queues(mq_prefix)[queue]["consumers"] == 0
    second = start_worker(procs, env, None, label="worker-fixed-2")
    assert worker_id(db, "fixed") == wid  # same name, same row, same queue
    found = until(procs, consumed(mq_prefix, queue), timeout=30, interval=0.2)
    assert [n for n in found if ".worker." in n] == [queue], found
    assert mq.queues(mq_prefix)[queue]["arguments"]["x-expires"] == 3000
    assert echo_completes(procs, "two")["worker_name"] == "fixed"

    # Gone for good: its queue, unused, is deleted by the broker after x-expires (3 s,
    # checked on the queue's tick).
    second.signal(signal.SIGTERM)
    assert second.wait(15) == 0, second.logs()
    assert queue in mq.live_queues(mq_prefix)  # not deleted by the worker...
    until(procs, lambda: queue not in mq.live_queues(mq_prefix), timeout=30, interval=0.2)  # ...but expired
    assert f"{mq_prefix}.executor.requests" in mq.live_queues(mq_prefix)  # not every queue, only that one

    # A worker coming back under that name later declares it again.
    start_worker(procs, env, None, label="worker-fixed-3")
    assert worker_id(db, "fixed") == wid
    until(procs, consumed(mq_prefix, queue), timeout=30, interval=0.2)
    assert echo_completes(procs, "three")["worker_name"] == "fixed"


# -- 6. the relay dies with messages in the outbox ---------------------------------------------


def test_relay_killed_outbox_drained_by_the_next_executor(
    procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str
) -> None:
    executor = start_executor(procs, env)
    worker = start_worker(procs, env, "w1", CONVEYOR__WORKER__MAX_CONCURRENT_TASKS=5)
    ids = request_executions(db, [("core.sleep", {"seconds": 0.5})] * 20)
    until(procs, lambda: statuses(db, ids).get("running", 0) >= 3)

    executor.kill()  # SIGKILL: the only relay is gone
    assert executor.returncode == -signal.SIGKILL
    # The worker finishes what it holds; its completions and capacity messages are
    # written to the outbox, and nobody publishes them.
    until(procs, lambda: statuses(db, ids).get("completed", 0) >= 3, timeout=20)
    until(procs, lambda: outbox_depth(db) > 0, timeout=10)
    piled = outbox_depth(db)
    stays(lambda: outbox_depth(db) >= piled, 1.0, message="the outbox shrank with no relay")
    waiting = statuses(db, ids)
    assert waiting.get("requested", 0) > 0, waiting  # the rest waits for an executor

    start_executor(procs, env, label="executor-2")
    until(procs, all_terminal(db, ids), timeout=60, interval=0.2)
    assert_completed_exactly_once(db, ids)
    until(procs, lambda: outbox_depth(db) == 0, timeout=30, interval=0.2)
    until(procs, queues_empty(mq_prefix), timeout=30, interval=0.2)
    assert_no_work_dead_lettered(db)
    assert worker.returncode is None, worker.logs()
    echo_completes(procs, "after")
