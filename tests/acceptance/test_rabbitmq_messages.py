"""Acceptance: the RabbitMQ transport under faults, with real ``conveyor`` processes
against a real broker and a real PostgreSQL. Each test has its own name prefix (its own
exchanges and queues); assertions are about what the database and ``rabbitmqctl`` say.

1. The topology declared follows the configuration given in the environment.
2. Malformed messages (not JSON, unknown type, a dispatch missing its fields) sent to the
   executors' and a worker's queue become ``rejected``/``invalid`` dead letters, are
   acknowledged, and harm nothing; so do bodies PostgreSQL cannot store as they are (NUL,
   NaN, infinities).
5. A worker's queue keeps its name across restarts under the same worker name, and the
   queue of a worker gone for good is removed by its ``x-expires``.

(3, 4 and 6, the faults under load, are in test_rabbitmq_faults.py.)
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from acceptance import mq
from acceptance.helpers import Procs, conveyor_env, stays, until
from acceptance.rabbitmq_kit import (
    IN_CI,
    LOST,
    MQ_SETTINGS,
    Conn,
    consumed,
    dead_letters,
    echo_completes,
    log_count,
    queues_empty,
    start_executor,
    start_worker,
    worker_id,
)

pytestmark = pytest.mark.acceptance


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
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
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
