"""Acceptance: Conveyor on a three-node RabbitMQ cluster (rabbitmq_cluster.py), one node
SIGKILLed under load and brought back.

An executor and two workers (real processes) are given the three nodes' addresses
(``message_queue.url``, comma-separated). Executions of a shell action that appends its
token to a file are requested steadily; the node with the most of our processes'
connections (then: the most queue leaders) is SIGKILLed mid-load and started again.

What must hold, from the database, the side-effect file and the broker:
- every execution completed, once: one attempt each, each token written once;
- no dispatch lost: the workers poll the database only every 30 s, so a lost dispatch
  would wait for the reconciler (``reconcile_after`` 15 s), which records every dispatch it
  publishes again (``execution_attempt.republished``): it must say 0. (The reconciler's
  rounds for ``requested`` executions are printed, not asserted: requests are also rung by
  NOTIFY, and a backlog on a loaded machine triggers them without any message lost.)
- the processes on the killed node moved to another one, on their own; the node rejoined;
  every quorum queue has its three members; nothing is left in a queue or the outbox.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from acceptance import rabbitmq_cluster as rc
from acceptance.helpers import Proc, Procs, conveyor_env, until
from acceptance.rabbitmq_kit import (
    Conn,
    all_terminal,
    assert_completed_exactly_once,
    assert_no_work_dead_lettered,
    log_count,
    outbox_depth,
    queues_empty,
    start_executor,
    start_worker,
)
from conveyor.sdk import request_executions
from conveyor.store.db import connect_sync

pytestmark = pytest.mark.acceptance

REQUESTS, BATCH, EVERY = 300, 5, 0.2  # 60 batches over about 12 s
RECONCILE_AFTER = 15
REPUBLISHED = "reconciler published messages again"


@pytest.fixture
def nodes() -> Iterator[list[rc.Node]]:
    with rc.own_nodes(3, first=1) as found:  # cvr1-3, AMQP 5701-5703
        yield found


@pytest.fixture
def prefix() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


@pytest.fixture
def env(db_url: str, nodes: list[rc.Node], prefix: str) -> dict[str, str]:
    return conveyor_env(
        db_url,
        CONVEYOR__TRANSPORT="rabbitmq",
        CONVEYOR__MESSAGE_QUEUE__URL=",".join(n.url for n in nodes),
        CONVEYOR__MESSAGE_QUEUE__PREFIX=prefix,
        CONVEYOR__MESSAGE_QUEUE__RECONCILE_AFTER=str(RECONCILE_AFTER),
        # Messages, not polling, must move the work: a lost one shows as a republish.
        CONVEYOR__WORKER__POLL_INTERVAL="30",
        CONVEYOR__EXECUTOR__POLL_INTERVAL="30",
        CONVEYOR__RECOVERY__SWEEP_INTERVAL="0.2",
    )


class Load(threading.Thread):
    """Requests ``REQUESTS`` executions, ``BATCH`` every ``EVERY`` seconds."""

    def __init__(self, db_url: str, side_effects: Path) -> None:
        super().__init__(daemon=True)
        self.db_url, self.side_effects = db_url, side_effects
        self.ids: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect_sync(self.db_url, "conveyor", application_name="load", autocommit=True) as conn:
                for start in range(0, REQUESTS, BATCH):
                    cmd = "echo {} >> " + str(self.side_effects) + "; sleep 0.3"
                    batch = [("core.local", {"cmd": cmd.format(i)}) for i in range(start, start + BATCH)]
                    self.ids += request_executions(conn, batch)
                    time.sleep(EVERY)
        except BaseException as exc:  # reported by the test
            self.error = exc


def _pick_victim(nodes: list[rc.Node], group: list[Proc], prefix: str) -> tuple[rc.Node, list[Proc]]:
    """The node with the most of our processes' connections, then the most queue leaders."""
    on = {p.name: rc.connected_node(nodes, p.pid) for p in group}
    leaders = Counter(q["leader"] for q in rc.quorum_queues(nodes[0], prefix).values())
    victim = max(nodes, key=lambda n: (sum(node is n for node in on.values()), leaders[n.name]))
    print(f"connections: { {k: v.name if v else None for k, v in on.items()} }; leaders: {dict(leaders)}")
    return victim, [p for p in group if on[p.name] is victim]


def _replicated(nodes: list[rc.Node], prefix: str) -> dict[str, dict[str, object]]:
    queues = rc.quorum_queues(nodes[0], prefix)
    names = sorted(n.name for n in nodes)
    wrong = {k: q for k, q in queues.items() if q["members"] != names}
    assert queues
    assert not wrong, wrong
    return queues


def test_node_killed_under_load(
    nodes: list[rc.Node], procs: Procs, env: dict[str, str], db: Conn, db_url: str, prefix: str, tmp_path: Path
) -> None:
    executor = start_executor(procs, env)
    workers = [start_worker(procs, env, name) for name in ("w1", "w2")]
    group = [executor, *workers]
    queues = _replicated(nodes, prefix)  # the executor's queue, the DLQ, both worker queues
    assert len(queues) == 4, queues

    side_effects = tmp_path / "side-effects"
    load = Load(db_url, side_effects)
    load.start()
    until(procs, lambda: len(load.ids) >= REQUESTS // 4 or load.error is not None, timeout=30)
    victim, moved = _pick_victim(nodes, group, prefix)
    assert moved, "no process was connected to the node to kill"

    killed_at = time.monotonic()
    row = db.execute("SELECT now() AS t").fetchone()
    assert row is not None
    db_killed_at = row["t"]
    rc.kill(victim)
    # Every process that was on it is connected again, to another node, on its own.
    reconnected: dict[str, float] = {}

    def all_moved() -> bool:
        for p in moved:
            now_on = rc.connected_node(nodes, p.pid)
            if p.name not in reconnected and now_on is not None and now_on is not victim:
                reconnected[p.name] = time.monotonic() - killed_at
        return len(reconnected) == len(moved)

    until(procs, all_moved, timeout=30, interval=0.05)
    # Brought back while the load goes on: it rejoins the cluster from its own data.
    rc.start([victim])
    rejoined = time.monotonic() - killed_at
    assert rc.running_nodes(nodes[0]) == {n.name for n in nodes}

    load.join(60)
    assert load.error is None, load.error
    ids = load.ids
    assert len(ids) == REQUESTS
    until(procs, all_terminal(db, ids), timeout=60, interval=0.2)
    drained = time.monotonic() - killed_at

    # Nothing lost, nothing run twice.
    assert_completed_exactly_once(db, ids)
    written = Counter(side_effects.read_text().split())
    assert written == Counter(str(i) for i in range(REQUESTS)), {k: n for k, n in written.items() if n != 1}
    republished = db.execute(
        "SELECT count(*) AS n FROM execution_attempt WHERE execution = ANY(%s) AND republished IS NOT NULL", (ids,)
    ).fetchone()
    assert republished is not None
    wake_ups = log_count(executor, REPUBLISHED)
    # The longest wait of a request for its start, and the longest pause in completions after the kill.
    waits = db.execute(
        """
        SELECT max(started - created) AS longest_wait,
               (SELECT max(gap) FROM (SELECT ended - lag(ended) OVER (ORDER BY ended) AS gap FROM execution
                                      WHERE id = ANY(%(ids)s) AND ended >= %(t)s) g) AS longest_pause
        FROM execution WHERE id = ANY(%(ids)s)
        """,
        {"ids": ids, "t": db_killed_at},
    ).fetchone()
    assert waits is not None
    print(
        f"\nRabbitMQ cluster: killed {victim.name} ({len(moved)} of {len(group)} processes on it), "
        f"executions completed {len(ids)}/{REQUESTS} once each, messages lost (republished by the reconciler) "
        f"{republished['n']} dispatches (reconciler rounds for requests: {wake_ups}); "
        f"processes reconnected to another node in "
        f"{', '.join(f'{k} {v:.2f}s' for k, v in sorted(reconnected.items()))}; node back in the cluster after "
        f"{rejoined:.1f}s; all done {drained:.1f}s after the kill; longest request-to-start "
        f"{waits['longest_wait'].total_seconds():.2f}s, longest pause in completions after the kill "
        f"{waits['longest_pause'].total_seconds():.2f}s"
    )
    assert republished["n"] == 0, "dispatches were lost and published again by the reconciler"

    # The queues are whole again, empty, and nothing waits to be published.
    _replicated(nodes, prefix)
    until(procs, lambda: outbox_depth(db) == 0, timeout=30, interval=0.2)
    until(procs, queues_empty(prefix), timeout=30, interval=0.2)
    assert_no_work_dead_lettered(db)
    for proc in group:
        assert proc.returncode is None, proc.logs()
        assert rc.connected_node(nodes, proc.pid) is not None, proc.logs()
