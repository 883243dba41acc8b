"""Acceptance: an installation whose worker queues dead-letter at most once (every
release before ``message_queue.rabbitmq.dead_letter_strategy``) moves to at-least-once
dead-lettering one worker at a time, with real processes on a
broker node of the test's own.

A queue's arguments cannot change in place (a declaration with others fails with
PRECONDITION_FAILED), so each worker recreates its own queue when it starts with the new
arguments: whatever the old queue held is still in the database as that worker's
scheduled executions, read on start. An executor still on the old arguments keeps
publishing to the recreated queue, and work completes throughout.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import pytest

from acceptance import mq
from acceptance import rabbitmq_cluster as rc
from acceptance.helpers import Procs, conveyor_env, until
from acceptance.rabbitmq_kit import (
    MQ_SETTINGS,
    Conn,
    consumed,
    echo_completes,
    start_executor,
    start_worker,
    worker_id,
)

pytestmark = pytest.mark.acceptance

STRATEGY = "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__DEAD_LETTER_STRATEGY"
RECREATED = "queue had other arguments; recreating it with the configured ones"


@pytest.fixture
def node() -> Iterator[rc.Node]:
    with rc.own_nodes(1, first=4) as found:  # cvr4, AMQP 5704: not the shared broker
        yield found[0]


@pytest.fixture
def mq_prefix() -> str:
    return f"u{uuid.uuid4().hex[:10]}"


@pytest.fixture
def env(db_url: str, node: rc.Node, mq_prefix: str) -> dict[str, str]:
    return conveyor_env(
        db_url, **MQ_SETTINGS, CONVEYOR__MESSAGE_QUEUE__URL=node.url, CONVEYOR__MESSAGE_QUEUE__PREFIX=mq_prefix
    )


def test_worker_queues_move_to_at_least_once_dead_lettering(
    procs: Procs, env: dict[str, str], db: Conn, mq_prefix: str, node: rc.Node
) -> None:
    old = {**env, STRATEGY: "at-most-once"}  # the arguments every earlier release declared
    executor = start_executor(procs, old, label="executor-old")
    worker = start_worker(procs, old, "w1", label="worker-w1-old")
    p, wid = mq_prefix, worker_id(db, "w1")
    wq = f"{p}.worker.{wid}.executions"
    until(procs, consumed(p, wq), timeout=30, interval=0.2)
    before = mq.queues(p)[wq]["arguments"]
    assert "x-dead-letter-strategy" not in before
    assert "x-overflow" not in before
    assert wq not in rc.at_least_once_queues(node)
    echo_completes(procs, "before")

    # The worker is upgraded: stopped, started with the new arguments (the default).
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.logs()
    upgraded = start_worker(procs, env, "w1", label="worker-w1-new")
    upgraded.wait_for_log(RECREATED)
    until(procs, consumed(p, wq), timeout=30, interval=0.2)
    after = mq.queues(p)[wq]["arguments"]
    assert after == {**before, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    # And the broker applies it (it would fall back to at-most-once silently otherwise).
    until(procs, lambda: wq in rc.at_least_once_queues(node), timeout=10, interval=0.2)

    # The executor still on the old arguments dispatches to the recreated queue; its
    # own queues are untouched (only worker queues changed).
    for n in range(3):
        echo_completes(procs, f"after-{n}")
    assert RECREATED not in executor.stderr() + executor.stdout()
    assert executor.returncode is None
    assert upgraded.returncode is None
