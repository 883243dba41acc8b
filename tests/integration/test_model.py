"""A model-based test: a hypothesis state machine drives executions through random
events against the real database and checks the same invariants after every step.

Events go through the product's own code: requests and cancels through the SDK
(``Client``, ``request_executions``), scheduling rounds of two executor replicas
(``Scheduler.run_round``, also both at once with a sweep), a replica dying between claim
and dispatch and the stale-claim reclaim, the dead-worker sweep and the schedule-to-start
monitor (``Recovery``), the dead-letter handler, the admission repair, ``workers drain``,
and the worker's named queries (``claim_scheduled``, ``finish``, ``canceling_on_worker``,
``heartbeat``, ``detach_runs``, and the graceful shutdown's hand-back and release).
Workers register through ``Liveness`` (row + liveness lock on a connection of their own);
they die by losing that connection (the lock goes with it) or hang (heartbeat stale, lock
kept, still able to write late). Admission policies are set per example, and raised, with
the operator's ``set_policy``. Duplicate messages are the same step again with the same
arguments: a result, a dead letter, a cancel, a claim, a round. Two writers also overlap
deterministically: a cancel left uncommitted while a result is written beside it.

The model keeps only what the test decided (policies, who requested what, which worker
processes live) and predicts each step's effect from that and from the database just
before it; the invariants are read from the database after every step. At teardown every
worker dies and a fresh one runs what is left: everything must end, and every admission
slot and queue row with it.

One database serves the whole run; each example starts from truncated tables. Run it
longer with CONVEYOR_MODEL_EXAMPLES=500. The races it found are pinned down in
test_races.py. The events live in two kits (model_executors.py, model_workers.py) that
the model owns; the settings and what the model knows (``World``) in model_world.py.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb

import conveyor
from conveyor.executor.scheduler import Scheduler
from conveyor.sdk import Client
from conveyor.store.db import connect_sync, make_pool
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.liveness import Liveness
from integration.model_executors import ExecutorEvents
from integration.model_workers import WorkerEvents
from integration.model_world import (
    EVENTS,
    ON_WORKER,
    OPTIONAL,
    PYTHON_ACTIONS,
    RESET,
    SCHEMA,
    TERMINAL,
    WORKER_CFG,
    WORKER_NAMES,
    WORKER_SPECS,
    Env,
    Policy,
    Proc,
    Snap,
    World,
    canonical,
    noop,
    noop_lost,
)


class Model(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        env.conn.execute(RESET)
        self.world = World(env)
        self.executors = ExecutorEvents(self.world)
        self.workers = WorkerEvents(self.world)
        self.ready = False
        # False from the start of a step until the invariants pass: teardown then drains
        # only an example whose steps all passed, and never masks the first failure.
        self.settled = True
        self.events: tuple[str, ...] = EVENTS
        self.terminal: dict[int, tuple[Any, ...]] = {}

    # -- setup and the one rule -----------------------------------------------------------

    @initialize(
        data=st.data(),
        echo_limit=st.integers(1, 2),
        echo_values=st.integers(2, 3),
        sleep=st.one_of(st.none(), st.tuples(st.integers(1, 2), st.sampled_from([(), ("seconds",)]))),
        pack=st.sampled_from([None, None, None, "core", "*"]),
        grace=st.sampled_from([3600.0, 0.0]),
        workers=st.lists(WORKER_SPECS, min_size=1, max_size=len(WORKER_NAMES)),
        quiet=st.sets(st.sampled_from(OPTIONAL), max_size=len(OPTIONAL) // 2),
    )
    def setup(
        self,
        data: st.DataObject,
        echo_limit: int,
        echo_values: int,
        sleep: tuple[int, tuple[str, ...]] | None,
        pack: str | None,
        grace: float,
        workers: list[tuple[int, set[str], bool]],
        quiet: set[str],
    ) -> None:
        # core.echo: enqueue, grouped by message; core.sleep: sometimes a cancel policy;
        # core.noop and core.local: unrestricted unless a pack or global policy governs them.
        self.world.policies["core.echo"] = Policy(echo_limit, ("message",), "enqueue")
        self.world.echo_values = ("a", "b", "c")[:echo_values]
        if sleep is not None:
            self.world.policies["core.sleep"] = Policy(sleep[0], sleep[1], "cancel")
        if pack is not None:
            self.world.policies[pack] = Policy(2, (), "enqueue")
        for target, p in self.world.policies.items():
            self.world.env.conn.execute(
                Q["set_policy"],
                {"target": target, "concurrency": p.concurrency, "parameters": list(p.parameters), "method": p.method},
            )
        self.world.grace = grace
        for name in "AB":
            self.world.schedulers[name] = Scheduler(
                self.world.env.pool, executor_id=f"ex-{name}", batch_size=4,
                no_worker_grace=grace, unplaceable_check_interval=0,
            )  # fmt: skip
        self.events = tuple(e for e in EVENTS if e not in quiet)
        for name, spec in zip(WORKER_NAMES, workers, strict=False):
            self.workers.start_worker(name, *spec)
        self.ready = True
        self.executors.submit(
            data.draw(st.lists(self.executors.request_spec(), max_size=6), label="initial requests"), batch=False
        )

    @rule(data=st.data())
    def happen(self, data: st.DataObject) -> None:
        self.settled = False
        what = data.draw(st.sampled_from(self.events), label="event")
        name = "on_" + what.replace(" ", "_")
        handler = getattr(self.executors, name, None) or getattr(self.workers, name)
        handler(data)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if self.ready:
            self.check(self.world.snapshot())
            self.settled = True

    def check(self, s: Snap) -> None:
        assert set(s.executions) == set(self.world.requested), "an execution appeared or vanished"
        for eid, e in s.executions.items():
            status, attempt = e["status"], e["attempt"]
            rows = s.attempts.get(eid, [])
            # Fencing tokens: attempts 1..n without gaps, n the execution's attempt.
            assert [a["attempt"] for a in rows] == list(range(1, attempt + 1)), (e, rows)
            # At most one open attempt, the current one, exactly while on a worker.
            open_ = [a for a in rows if a["ended"] is None]
            assert all((a["ended"] is None) == (a["outcome"] is None) for a in rows), (e, rows)
            if status in ON_WORKER:
                assert [a["attempt"] for a in open_] == [attempt], (e, rows)
                assert e["worker"] is None or open_[0]["worker"] == e["worker"], (e, rows)
                assert status != "scheduled" or e["worker"] is not None, e
            else:
                assert open_ == [], (e, rows)
            assert (e["ended"] is not None) == (status in TERMINAL), e
            if status == "requested":
                assert (e["worker"], e["executor"]) == (None, None), e
            # Nothing stays in scheduling once a round is over, but a crashed replica's claims.
            if status == "scheduling":
                assert eid in self.world.stuck, e
            # Terminal is final: status, result and end time never change again.
            if status in TERMINAL:
                final = (status, canonical(e["result"]), e["ended"], attempt)
                assert self.terminal.setdefault(eid, final) == final, (e, self.terminal[eid])
            else:
                assert eid not in self.terminal, e
        # A worker runs at most its capacity. (Its dispatches may exceed it for a while: a
        # process restarted with a smaller capacity inherits its predecessor's; see rounds.)
        running = Counter(e["worker"] for e in s.executions.values() if e["status"] in ("running", "canceling"))
        for wid, w in s.workers.items():
            assert running[wid] <= w["capacity"], (w, running[wid])
        for proc in self.world.acting("alive"):
            assert s.workers[proc.worker_id]["status"] == "active", s.workers[proc.worker_id]
        self.check_admission(s)

    def check_admission(self, s: Snap) -> None:
        """Per group, in request order, the live (non-terminal) executions: under enqueue
        the first ``concurrency`` hold a slot and the others wait; under cancel each holds
        one. Terminal and ungoverned executions hold nothing."""
        members: dict[tuple[str, str], list[int]] = defaultdict(list)
        for eid, r in sorted(self.world.requested.items()):
            if r.policy is not None and r.group is not None and s.executions[eid]["status"] not in TERMINAL:
                members[(r.policy, r.group)].append(eid)
        holders: dict[int, tuple[str, str]] = {}
        waiters: dict[int, tuple[str, str]] = {}
        for key, live in members.items():
            policy = self.world.policies[key[0]]
            if policy.method == "enqueue":
                holders.update(dict.fromkeys(live[: policy.concurrency], key))
                waiters.update(dict.fromkeys(live[policy.concurrency :], key))
            else:
                assert len(live) <= policy.concurrency, (key, live)
                holders.update(dict.fromkeys(live, key))
        got_slots = {eid: (r["policy"], canonical(r["group_key"])) for eid, r in s.slots.items()}
        got_queue = {eid: (r["policy"], canonical(r["group_key"])) for eid, r in s.queue.items()}
        assert got_slots == holders, ("slots", got_slots, holders)
        assert got_queue == waiters, ("queue", got_queue, waiters)
        # FIFO by the group's numbering; a waiter is never taken by an executor.
        for key in members:
            held = [r["seq"] for eid, r in s.slots.items() if got_slots[eid] == key]
            queued = [r["seq"] for eid, r in s.queue.items() if got_queue[eid] == key]
            assert not held or not queued or max(held) < min(queued), (key, held, queued)
        for eid in s.queue:
            assert s.executions[eid]["status"] == "requested", s.executions[eid]
        if s.queue:
            event("executions waiting for admission")

    # -- teardown: run everything to its end ----------------------------------------------

    def teardown(self) -> None:
        try:
            if self.ready and self.settled:
                self.drain()
        finally:
            for proc in self.world.every_proc:
                self.world.env.run(proc.liveness._drop_connection())

    def drain(self) -> None:
        """Every worker dies, the sweep recovers their work, a fresh worker runs the rest:
        everything ends (no waiter is left behind), and every slot and queue row with it."""
        if self.world.stuck:
            self.world.env.run(self.world.schedulers["A"].reclaim_stale(1e-6))
            self.world.stuck.clear()
        for proc in self.world.acting():
            self.world.env.run(proc.liveness._drop_connection())
            proc.state, proc.runs = "killed", {}
        self.world.env.conn.execute("UPDATE worker SET last_heartbeat = now() - interval '1 hour'")
        self.world.env.run(self.world.recovery.sweep())
        registration = {
            "name": "drain", "runtimes": ["python", "shell"], "actions": list(PYTHON_ACTIONS),
            "capabilities": Jsonb({}), "capacity": 10, "host": "model", "pid": 0, "version": conveyor.__version__,
        }  # fmt: skip
        liveness = Liveness(self.world.env.url, SCHEMA, WORKER_CFG, registration, on_lost=noop_lost, on_rejoined=noop)
        worker_id = self.world.env.run(liveness.start())
        self.world.every_proc.append(
            Proc("drain", liveness, worker_id, 10, frozenset(PYTHON_ACTIONS), ("python", "shell"))
        )
        busy = "SELECT 1 FROM execution WHERE status <> ALL(%s)"
        for _ in range(len(self.world.requested) + 5):  # each pass ends at least one per group
            if not self.world.env.conn.execute(busy, (list(TERMINAL),)).fetchone():
                break
            self.world.env.run(self.world.schedulers["A"].run_round())
            runs = self.world.env.conn.execute(Q["claim_scheduled"], {"worker": worker_id, "limit": 10}).fetchall()
            # One batch, as the worker's result writer sends them.
            n = len(runs)
            written = self.world.env.conn.execute(
                Q["finish"],
                {
                    "worker": worker_id, "ids": [r["id"] for r in runs], "attempts": [r["attempt"] for r in runs],
                    "statuses": ["completed"] * n, "outcomes": ["completed"] * n, "delays": [None] * n,
                    "results": [Jsonb({"succeeded": True})] * n, "errors": [None] * n,
                },
            ).fetchall()  # fmt: skip
            assert sorted(r["id"] for r in written) == sorted(r["id"] for r in runs)
        s = self.world.snapshot()
        unfinished = {eid: e["status"] for eid, e in s.executions.items() if e["status"] not in TERMINAL}
        assert unfinished == {}, f"left after the drain: {unfinished}, slots {s.slots}, queue {s.queue}"
        assert s.slots == {}
        assert s.queue == {}
        self.check(s)


@pytest.fixture
def env(db_url: str) -> Iterator[Env]:
    loop = asyncio.new_event_loop()
    pool = make_pool(db_url, SCHEMA, "model", 6)
    loop.run_until_complete(pool.open())
    try:
        with (
            connect_sync(db_url, SCHEMA, autocommit=True) as conn,
            connect_sync(db_url, SCHEMA, autocommit=True) as other,
            Client(db_url, SCHEMA) as client,
        ):
            yield Env(db_url, loop, pool, PostgresTransport(db_url, SCHEMA), conn, other, client)
    finally:
        loop.run_until_complete(pool.close())
        loop.close()


@pytest.mark.timeout(900)  # shrinking a failure replays many examples (hypothesis caps it at 5 min)
def test_executions_under_random_events_keep_every_invariant(env: Env) -> None:
    run_state_machine_as_test(
        lambda: Model(env),
        settings=settings(
            # About 30 s on a loaded 2-core machine; raise it for a longer hunt.
            max_examples=int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "40")),
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
