"""Acceptance: the RabbitMQ transport under faults, with real ``conveyor`` processes
against a real broker and a real PostgreSQL. Each test has its own name prefix (its own
exchanges and queues); assertions are about what the database and ``rabbitmqctl`` say.

3. The broker restarted under load: every execution completes exactly once, the outbox
   drains, every process reconnects.
4. The processes' broker connections killed under load: the same; and after each loss
   of a healthy session the reconnection is prompt (the backoff starts over).
6. The relay dies (SIGKILL of the only executor) while workers keep writing to the outbox:
   a new executor publishes what piled up and everything completes.

(1, 2 and 5 are in test_rabbitmq_messages.py.)
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest

from acceptance import mq
from acceptance.helpers import Proc, Procs, conveyor_env, stays, until
from acceptance.private_broker import private_broker
from acceptance.rabbitmq_kit import (
    CONNECTED,
    IN_CI,
    LOST,
    MQ_SETTINGS,
    TERMINAL,
    Conn,
    all_terminal,
    assert_completed_exactly_once,
    assert_no_work_dead_lettered,
    echo_completes,
    log_count,
    outbox_depth,
    queues_empty,
    start_executor,
    start_worker,
    statuses,
    wait_log_count,
)
from conveyor.sdk import request_executions

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


@pytest.fixture
def own_broker_env(db_url: str, mq_prefix: str, broker_ctl: None) -> Iterator[dict[str, str]]:
    """On a broker node of this test's own (private_broker.py): restarting the shared one
    would pull it from under the tests running beside this one."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(private_broker())
        except RuntimeError as exc:
            if IN_CI:
                pytest.fail(f"{exc} (CI=true: a missing service fails the run)")
            pytest.skip(str(exc))
        yield conveyor_env(db_url, **MQ_SETTINGS, CONVEYOR__MESSAGE_QUEUE__URL=url,
                           CONVEYOR__MESSAGE_QUEUE__PREFIX=mq_prefix)  # fmt: skip


# -- 3 and 4. the broker restarted, connections killed, under load ------------------------------


# Sleeps of 0.5 s on 2 x 10 slots: a batch of 200 keeps the workers busy for 5 s at least,
# so the fault hits work in flight even when it takes rabbitmqctl a few seconds (each call
# starts an Erlang VM; slower with the suite's other processes running beside it).
LOAD = ("core.sleep", {"seconds": 0.5})


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


def test_broker_restart_under_load(own_broker_env: dict[str, str], procs: Procs, db: Conn, mq_prefix: str) -> None:
    group, ids = _under_load(procs, own_broker_env, db)
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
