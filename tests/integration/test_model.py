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
test_races.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections import Counter, defaultdict
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

import conveyor
from conveyor.config import Settings, WorkerSettings
from conveyor.domain.errors import ConflictError
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.executor.recovery import Recovery
from conveyor.executor.scheduler import NO_WORKERS, Scheduler
from conveyor.sdk import Client, request_executions
from conveyor.store.db import connect_sync, make_pool
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.liveness import Liveness, NameInUseError

Conn = psycopg.Connection[dict[str, Any]]
Pool = AsyncConnectionPool[Any]
Row = dict[str, Any]
T = TypeVar("T")

SCHEMA = "conveyor"
TERMINAL = frozenset({"completed", "failed", "cancelled", "timeout", "abandoned"})
ON_WORKER = frozenset({"scheduled", "running", "canceling"})
PYTHON_ACTIONS = ("core.echo", "core.noop", "core.sleep")
WORKER_NAMES = ("w1", "w2", "w3")
MAX_EXECUTIONS = 40  # per example: bounds the run time and the drain at teardown
LOST_MAX = 2  # recovery.worker_lost_max_attempts: the second loss abandons
RESCHEDULES = 1  # executor.scheduled_timeout_reschedules: the second missed start fails

# Every threshold is tiny or huge so that no outcome depends on timing: any dispatch is
# overdue for the schedule-to-start monitor, any claim is stale for the reclaim, re-runs
# after a lost worker are immediate, and a live worker never goes stale by itself (no
# heartbeat loop runs here).
SETTINGS = Settings(
    executor={"scheduled_timeout": 1e-6, "scheduled_timeout_reschedules": RESCHEDULES},
    recovery={"worker_lost_max_attempts": LOST_MAX, "backoff_base": 0, "backoff_max": 0},
)
WORKER_CFG = WorkerSettings(heartbeat_interval=1000, lock_grace=0)

# A worker: capacity, the Python actions it has code for (mostly all), whether it offers
# the shell runtime (core.local).
WORKER_SPECS = st.tuples(
    st.integers(1, 3),
    st.one_of(st.just(set(PYTHON_ACTIONS)), st.sets(st.sampled_from(PYTHON_ACTIONS), min_size=1)),
    st.sampled_from([True, True, False]),
)

# The events and their weights. One rule draws them, rather than a rule each: hypothesis's
# swarm testing turns whole rules off per example, which would mostly cut the request ->
# round -> claim -> finish chain. Instead each example silences a few optional ones (see
# setup). Losing workers is rarer than getting them back, so that work keeps flowing.
WEIGHTS = {
    "request": 6, "round A": 4, "claim": 6, "finish": 6, "round B": 3, "cancel during result": 2,
    "cancel": 2, "finish late": 1, "result again": 1, "honour cancels": 1, "sweep": 1,
    "scheduled timeouts": 1, "dead letter": 1, "replicas race": 1, "crash after claim": 1, "reclaim": 1,
    "admission repair": 1, "raise limit": 1, "start worker": 3, "uncordon worker": 2, "kill worker": 1,
    "hang worker": 1, "resume worker": 1, "stop worker": 1, "drain worker": 1,
}  # fmt: skip
EVENTS = tuple(name for name, weight in WEIGHTS.items() for _ in range(weight))
OPTIONAL = ("cancel", "scheduled timeouts", "dead letter", "crash after claim", "kill worker", "hang worker",
            "drain worker", "replicas race", "stop worker", "raise limit")  # fmt: skip

# Each example starts from these tables emptied (actions and migrations stay).
RESET = (
    "TRUNCATE execution, execution_attempt, worker, outbox, dead_letter, admission_policy,"
    " execution_admission_group, execution_admission_slot, execution_admission_queue RESTART IDENTITY CASCADE"
)


@dataclass
class Env:
    """What every example shares: one database, one event loop for the async classes."""

    url: str
    loop: asyncio.AbstractEventLoop
    pool: Pool
    transport: PostgresTransport
    conn: Conn  # autocommit: the worker's queries and the test's reads
    other: Conn  # a second writer, with a transaction left open on purpose
    client: Client  # the SDK: requests and cancels

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)


@dataclass(eq=False)
class Proc:
    """One worker process. ``state``: alive; hung (heartbeat stale, lock still held, may
    still write); killed (connection gone, writes nothing more)."""

    name: str
    liveness: Liveness
    worker_id: int
    capacity: int
    actions: frozenset[str]
    runtimes: tuple[str, ...]
    state: str = "alive"
    runs: dict[int, int] = field(default_factory=dict)  # execution -> attempt it believes it runs

    def __repr__(self) -> str:
        return f"Proc({self.name}#{self.worker_id}, {self.state}, runs={self.runs})"


@dataclass(frozen=True)
class Result:
    """A result message as the worker sends it (``finish``), kept for redelivery."""

    proc: Proc
    execution: int
    attempt: int
    status: str
    outcome: str
    delay: float | None

    def params(self) -> dict[str, Any]:
        return finish_params(self.proc.worker_id, self.execution, self.attempt, self.status, self.outcome, self.delay)


@dataclass(frozen=True)
class Dispatch:
    """A dispatch seen after a round: what a dead letter for it names."""

    id: int
    attempt: int
    worker: int
    scheduled: datetime


@dataclass(frozen=True)
class Policy:
    concurrency: int
    parameters: tuple[str, ...]
    method: str


@dataclass(frozen=True)
class Requested:
    ref: str
    parameters: dict[str, Any]
    policy: str | None  # the policy that governed it at request time
    group: str | None  # its group key, as canonical JSON


@dataclass
class Snap:
    executions: dict[int, Row]
    attempts: dict[int, list[Row]]
    slots: dict[int, Row]
    queue: dict[int, Row]
    workers: dict[int, Row]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def finish_params(
    worker: int,
    eid: int,
    attempt: int,
    status: str = "completed",
    outcome: str = "completed",
    delay: float | None = None,
) -> dict[str, Any]:
    """Parameters of the worker's ``finish`` for one result (it takes a batch)."""
    return {
        "worker": worker, "ids": [eid], "attempts": [attempt], "statuses": [status], "outcomes": [outcome],
        "delays": [delay], "results": [Jsonb({"succeeded": outcome == "completed"})],
        "errors": [None if outcome == "completed" else outcome],
    }  # fmt: skip


async def claim_then_crash(scheduler: Scheduler, pool: Pool) -> list[int]:
    """The first transaction of a round (claims committed), then the replica dies before
    placing anything: the ``scheduler.after_claim`` failpoint, in-process."""
    async with pool.connection() as conn, conn.pipeline():
        rows = await scheduler._claim(conn)
    return [r["id"] for r in rows]


async def _noop() -> None:
    return None


async def _noop_lost(reason: str) -> None:
    return None


class Model(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        env.conn.execute(RESET)
        self.ready = False
        # False from the start of a step until the invariants pass: teardown then drains
        # only an example whose steps all passed, and never masks the first failure.
        self.settled = True
        self.events: tuple[str, ...] = EVENTS
        self.policies: dict[str, Policy] = {}
        self.echo_values: tuple[str, ...] = ("a", "b")
        self.requested: dict[int, Requested] = {}
        self.procs: dict[str, Proc] = {}  # the latest process of each worker name
        self.every_proc: list[Proc] = []  # to close their connections at teardown
        self.cordoned: set[str] = set()
        self.stuck: set[int] = set()  # claims left in scheduling by crashed replicas
        self.terminal: dict[int, tuple[Any, ...]] = {}
        self.dispatches: list[Dispatch] = []
        self.results: list[Result] = []
        self.dead_letters: dict[str, str] = {}  # dedupe key -> first resolution
        self.crashes = itertools.count(1)
        self.writer_pid: int | None = None
        self.grace = 0.0
        self.schedulers: dict[str, Scheduler] = {}
        self.recovery = Recovery(env.pool, env.transport, SETTINGS)
        self.dead_letter_handler = DeadLetterHandler(env.pool, env.transport, SETTINGS, "ex-A")

    # -- reading the database -----------------------------------------------------------

    def snapshot(self) -> Snap:
        c = self.env.conn
        executions = {r["id"]: r for r in c.execute("SELECT * FROM execution ORDER BY id").fetchall()}
        attempts: dict[int, list[Row]] = defaultdict(list)
        for a in c.execute("SELECT * FROM execution_attempt ORDER BY execution, attempt").fetchall():
            attempts[a["execution"]].append(a)
        slots = {r["execution"]: r for r in c.execute("SELECT * FROM execution_admission_slot").fetchall()}
        queue = {r["execution"]: r for r in c.execute("SELECT * FROM execution_admission_queue").fetchall()}
        workers = {r["id"]: r for r in c.execute("SELECT * FROM worker").fetchall()}
        return Snap(executions, attempts, slots, queue, workers)

    def execution(self, eid: int) -> Row:
        found = self.env.conn.execute("SELECT * FROM execution WHERE id = %s", (eid,)).fetchone()
        assert found is not None
        return found

    def attempt_row(self, eid: int, attempt: int) -> Row | None:
        return self.env.conn.execute(
            "SELECT * FROM execution_attempt WHERE execution = %s AND attempt = %s", (eid, attempt)
        ).fetchone()

    def model_dead(self) -> set[int]:
        """Worker ids whose latest process is not alive (killed or hung)."""
        return {p.worker_id for p in self.procs.values() if p.state != "alive"}

    def acting(self, *states: str) -> list[Proc]:
        """Processes in one of ``states`` (default: alive or hung, i.e. able to write), by name."""
        return [p for _, p in sorted(self.procs.items()) if p.state in (states or ("alive", "hung"))]

    def policy_for(self, ref: str) -> str | None:
        for target in (ref, ref.split(".", 1)[0], "*"):
            if target in self.policies:
                return target
        return None

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
        self.policies["core.echo"] = Policy(echo_limit, ("message",), "enqueue")
        self.echo_values = ("a", "b", "c")[:echo_values]
        if sleep is not None:
            self.policies["core.sleep"] = Policy(sleep[0], sleep[1], "cancel")
        if pack is not None:
            self.policies[pack] = Policy(2, (), "enqueue")
        for target, p in self.policies.items():
            self.env.conn.execute(
                Q["set_policy"],
                {"target": target, "concurrency": p.concurrency, "parameters": list(p.parameters), "method": p.method},
            )
        self.grace = grace
        for name in "AB":
            self.schedulers[name] = Scheduler(
                self.env.pool, self.env.transport, executor_id=f"ex-{name}", batch_size=4,
                no_worker_grace=grace, unplaceable_check_interval=0,
            )  # fmt: skip
        self.events = tuple(e for e in EVENTS if e not in quiet)
        for name, spec in zip(WORKER_NAMES, workers, strict=False):
            self.start_worker(name, *spec)
        self.ready = True
        self.submit(data.draw(st.lists(self.request_spec(), max_size=6), label="initial requests"), batch=False)

    @rule(data=st.data())
    def happen(self, data: st.DataObject) -> None:
        self.settled = False
        what = data.draw(st.sampled_from(self.events), label="event")
        getattr(self, "on_" + what.replace(" ", "_"))(data)

    # -- requests and cancels -------------------------------------------------------------

    def request_spec(self) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
        return st.one_of(
            st.sampled_from(self.echo_values).map(lambda m: ("core.echo", {"message": m})),
            st.sampled_from([0, 1]).map(lambda s: ("core.sleep", {"seconds": s})),
            st.just(("core.noop", {})),
            st.sampled_from(["true", "false"]).map(lambda c: ("core.local", {"cmd": c})),
        )

    def on_request(self, data: st.DataObject) -> None:
        if len(self.requested) < MAX_EXECUTIONS:
            specs = data.draw(st.lists(self.request_spec(), min_size=1, max_size=3), label="requests")
            # A batch is one INSERT: the admission trigger sees all of them in one statement.
            self.submit(specs, batch=data.draw(st.booleans(), label="one statement"))

    def submit(self, specs: list[tuple[str, dict[str, Any]]], batch: bool) -> None:
        """Request through the SDK; each governed request is admitted, queued or (cancel
        policy, group full) refused at once."""
        if not specs:
            return
        status = {r["id"]: r["status"] for r in self.env.conn.execute("SELECT id, status FROM execution").fetchall()}
        if batch:
            with self.env.client.conn.transaction():
                ids = request_executions(self.env.client.conn, specs)
        else:
            ids = [self.env.client.request(ref, params) for ref, params in specs]
        assert ids == sorted(ids)
        rows = {r["id"]: r for r in self.env.conn.execute("SELECT * FROM execution WHERE id = ANY(%s)", (ids,))}
        held: Counter[tuple[str, str]] = Counter(
            (r.policy, r.group)
            for eid, r in self.requested.items()
            if r.policy and r.group and status[eid] not in TERMINAL
        )
        for eid, (ref, params) in zip(ids, specs, strict=True):
            target, group, row = self.policy_for(ref), None, rows[eid]
            if target is not None:
                policy = self.policies[target]
                group = canonical({p: params.get(p) for p in policy.parameters})
                if policy.method == "cancel" and held[(target, group)] >= policy.concurrency:
                    event("request refused by a cancel policy")
                    assert row["status"] == "cancelled", row
                    assert row["result"]["cancelled_by"] == "admission", row
                    assert row["result"]["policy"] == target, row
                    self.requested[eid] = Requested(ref, params, target, group)
                    continue
                held[(target, group)] += 1
            assert row["status"] == "requested", row
            self.requested[eid] = Requested(ref, params, target, group)

    def on_cancel(self, data: st.DataObject) -> None:
        """The SDK's cancel (the API runs the same query). Drawn again for the same
        execution, it is a duplicate request."""
        if not self.requested:
            return
        eid = data.draw(st.sampled_from(sorted(self.requested)), label="execution")
        before = self.execution(eid)
        try:
            now: str | None = self.env.client.cancel(eid, by="model")
        except ConflictError:
            now = None
        self.check_cancel(before, now)

    def check_cancel(self, before: Row, now: str | None) -> None:
        """Not started: cancelled at once; running: canceling, for its worker to stop (asked
        again meanwhile: the same answer); ended: refused, nothing changed."""
        eid = before["id"]
        expected = {"requested": "cancelled", "scheduling": "cancelled", "scheduled": "cancelled"}.get(
            before["status"], "canceling" if before["status"] in ("running", "canceling") else None
        )
        assert now == expected, (before, now)
        event(f"cancel: {before['status']} -> {now}")
        after = self.execution(eid)
        if now is None or before["status"] == "canceling":
            assert after == before
        else:
            assert after["status"] == now
        if before["status"] == "scheduled":  # the dispatch's attempt is closed
            closed = self.attempt_row(eid, before["attempt"])
            assert closed is not None
            assert (closed["outcome"], closed["ended"] is not None) == ("cancelled", True), closed
        if now == "cancelled":
            self.stuck.discard(eid)

    # -- executors ------------------------------------------------------------------------

    def new_dispatches(self, before: Snap, after: Snap) -> list[Dispatch]:
        """Executions dispatched by the step; each must be on a worker that could take it."""
        found = []
        open_ = {p.worker_id: p for p in self.acting("alive") if p.name not in self.cordoned}
        for eid, e in after.executions.items():
            was = before.executions.get(eid)
            if e["status"] != "scheduled" or (was and was["status"] == "scheduled" and was["attempt"] == e["attempt"]):
                continue
            assert was is not None, f"{eid} dispatched from nowhere"
            assert was["status"] == "requested", f"{eid} dispatched from {was}"
            assert eid not in before.queue, f"waiter {eid} was dispatched"
            proc = open_.get(e["worker"])
            assert proc is not None, f"{eid} dispatched to worker {e['worker']}: dead, cordoned or unknown"
            ref = e["action_ref"]
            assert ref in proc.actions or (ref == "core.local" and "shell" in proc.runtimes), (ref, proc)
            found.append(Dispatch(eid, e["attempt"], e["worker"], e["scheduled"]))
        load = Counter(e["worker"] for e in after.executions.values() if e["status"] in ON_WORKER and e["worker"])
        for wid in {d.worker for d in found}:
            assert load[wid] <= after.workers[wid]["capacity"], ("dispatched beyond capacity", after.workers[wid])
        self.dispatches += found
        return found

    def round(self, executor: str) -> None:
        before = self.snapshot()
        result = self.env.run(self.schedulers[executor].run_round())
        after = self.snapshot()
        new = self.new_dispatches(before, after)
        assert result.dispatched == len(new), (result, new)
        if new:
            event("round: dispatched")
        for eid, e in after.executions.items():
            was = before.executions[eid]
            if was["status"] != "failed" and e["status"] == "failed":
                event("round: failed, no worker")
                assert e["result"]["failed_by"] == "scheduler", e
                assert e["result"]["error"] == NO_WORKERS.format(ref=e["action_ref"])
                assert was["status"] == "requested", was
                assert eid not in before.queue

    def on_round_A(self, data: st.DataObject) -> None:
        self.round("A")

    def on_round_B(self, data: st.DataObject) -> None:
        self.round("B")

    async def race(self) -> tuple[Any, Any, Any]:
        a, b, swept = await asyncio.gather(
            self.schedulers["A"].run_round(), self.schedulers["B"].run_round(), self.recovery.sweep()
        )
        return a, b, swept

    def on_replicas_race(self, data: st.DataObject) -> None:
        """Both replicas' rounds and a sweep at the same time, each on its own connection."""
        before = self.snapshot()
        a, b, _ = self.env.run(self.race())
        after = self.snapshot()
        new = self.new_dispatches(before, after)
        assert a.dispatched + b.dispatched == len(new), (a, b, new)
        self.check_swept(after)

    def on_crash_after_claim(self, data: st.DataObject) -> None:
        """A replica claims, then dies before placing anything (its restart has a new id)."""
        scheduler = Scheduler(
            self.env.pool, self.env.transport, executor_id=f"ex-C{next(self.crashes)}", batch_size=4,
            no_worker_grace=self.grace, unplaceable_check_interval=0,
        )  # fmt: skip
        before = self.snapshot()
        ids = self.env.run(claim_then_crash(scheduler, self.env.pool))
        for eid in ids:
            assert before.executions[eid]["status"] == "requested"
            assert eid not in before.queue
            assert self.execution(eid)["status"] == "scheduling"
        self.stuck |= set(ids)

    def on_reclaim(self, data: st.DataObject) -> None:
        before = self.snapshot()
        stuck = {eid for eid, e in before.executions.items() if e["status"] == "scheduling"}
        assert stuck <= self.stuck
        assert self.env.run(self.schedulers["B"].reclaim_stale(1e-6)) == len(stuck)
        for eid in stuck:
            now = self.execution(eid)
            assert (now["status"], now["executor"]) == ("requested", None), now
            assert now["attempt"] == before.executions[eid]["attempt"], now
        self.stuck.clear()

    # -- recovery -------------------------------------------------------------------------

    def check_swept(self, after: Snap) -> None:
        """After a sweep nothing is on a worker the model knows is dead."""
        for wid in self.model_dead():
            assert after.workers[wid]["status"] == "inactive", after.workers[wid]
        for e in after.executions.values():
            if e["status"] in ON_WORKER:
                assert e["worker"] is not None, e
                assert after.workers[e["worker"]]["status"] != "inactive", e
                assert e["worker"] not in self.model_dead(), e

    def on_sweep(self, data: st.DataObject) -> None:
        before = self.snapshot()
        dead = {wid for wid in self.model_dead() if before.workers[wid]["status"] != "inactive"}
        counts = self.env.run(self.recovery.sweep())
        after = self.snapshot()
        assert counts["dead"] == len(dead), (counts, dead)
        gone = {wid for wid, w in after.workers.items() if w["status"] == "inactive"}
        for eid, was in before.executions.items():
            now = after.executions[eid]
            status, worker = was["status"], was["worker"]
            if status == "scheduled" and worker in gone:
                event("sweep: handed back")  # never started: its attempt withdrawn
                assert (now["status"], now["attempt"], now["worker"]) == ("requested", was["attempt"] - 1, None)
                assert self.attempt_row(eid, was["attempt"]) is None
            elif status in ("running", "canceling") and (worker is None or worker in gone):
                lost = sum(1 for a in before.attempts[eid] if a["outcome"] == "worker_lost") + 1
                expected = "cancelled" if status == "canceling" else "abandoned" if lost >= LOST_MAX else "requested"
                event(f"sweep: {status} -> {expected}")
                assert (now["status"], now["attempt"]) == (expected, was["attempt"]), (was, now)
                closed = self.attempt_row(eid, was["attempt"])
                assert closed is not None
                assert closed["outcome"] == "worker_lost"
            else:
                assert now["status"] == status, (was, now)
        self.check_swept(after)

    def on_scheduled_timeouts(self, data: st.DataObject) -> None:
        """Every dispatch is overdue (timeout 1 µs): moved on once, failed the second time."""
        before = self.snapshot()
        self.env.run(self.recovery.check_scheduled_timeouts())
        after = self.snapshot()
        for eid, was in before.executions.items():
            now = after.executions[eid]
            if was["status"] != "scheduled":
                assert now["status"] == was["status"], (was, now)
                continue
            missed = sum(1 for a in before.attempts[eid] if a["outcome"] in ("not_picked_up", "expired"))
            expected = "requested" if missed < RESCHEDULES else "failed"
            event(f"scheduled timeout -> {expected}")
            assert (now["status"], now["attempt"]) == (expected, was["attempt"]), (was, now)
            closed = self.attempt_row(eid, was["attempt"])
            assert closed is not None
            assert closed["outcome"] == "not_picked_up"

    def on_dead_letter(self, data: st.DataObject) -> None:
        """A dispatch expired in its worker's queue. Drawn again, it is a redelivery of the
        same dead letter; drawn after the execution moved on, a stale one."""
        if not self.dispatches:
            return
        dispatch = data.draw(st.sampled_from(self.dispatches), label="dispatch")
        handler = self.dead_letter_handler
        letter = handler._expired(
            {"id": dispatch.id, "attempt": dispatch.attempt, "worker": dispatch.worker, "scheduled": dispatch.scheduled}
        )
        before = self.snapshot()
        was = before.executions[dispatch.id]
        current = (was["status"], was["attempt"], was["worker"], was["scheduled"]) == (
            "scheduled",
            dispatch.attempt,
            dispatch.worker,
            dispatch.scheduled,
        )
        again = letter.dedupe_key in self.dead_letters
        if again:
            expected = self.dead_letters[letter.dedupe_key]
        elif current:
            missed = sum(1 for a in before.attempts[dispatch.id] if a["outcome"] in ("not_picked_up", "expired"))
            expected = "rescheduled" if missed < RESCHEDULES else "failed"
        else:
            expected = "stale"
        resolution = self.env.run(handler.handle(letter))
        assert resolution == expected, (dispatch, was, resolution)
        event(f"dead letter: {resolution}{' (redelivered)' if again else ''}")
        after = self.snapshot()
        if again or expected == "stale":
            assert after.executions == before.executions
            assert after.attempts == before.attempts
        else:
            now = after.executions[dispatch.id]
            assert now["status"] == ("requested" if expected == "rescheduled" else "failed"), now
            closed = self.attempt_row(dispatch.id, dispatch.attempt)
            assert closed is not None
            assert closed["outcome"] == "expired"
        self.dead_letters.setdefault(letter.dedupe_key, resolution)

    def on_raise_limit(self, data: st.DataObject) -> None:
        """An operator raises a policy's limit: its waiters are admitted up to it at once."""
        target = data.draw(st.sampled_from(sorted(self.policies)), label="policy")
        p = self.policies[target]
        if p.concurrency < 3:
            raised = Policy(p.concurrency + 1, p.parameters, p.method)
            self.env.conn.execute(
                Q["set_policy"],
                {"target": target, "concurrency": raised.concurrency, "parameters": list(p.parameters),
                 "method": p.method},
            )  # fmt: skip
            self.policies[target] = raised

    def on_admission_repair(self, data: st.DataObject) -> None:
        """The executors' upkeep finds nothing to mend: the triggers never leave a free
        slot with someone waiting for it."""
        assert self.env.run(self.schedulers["A"].repair_admission()) == 0

    # -- worker processes -----------------------------------------------------------------

    def start_worker(self, name: str, capacity: int, actions: set[str], shell: bool) -> None:
        """A process starts under ``name``: refused while a process holding the name's
        lock exists; else it takes the row (same id) and detaches what a dead predecessor
        left running, for the sweep."""
        old = self.procs.get(name)
        if old is not None and old.state == "alive":
            return  # that process is running: nothing to start
        runtimes = ("python", "shell") if shell else ("python",)
        registration = {
            "name": name, "runtimes": list(runtimes), "actions": sorted(actions),
            "capabilities": Jsonb({"max_concurrent_tasks": capacity}), "capacity": capacity,
            "host": "model", "pid": 0, "version": conveyor.__version__,
        }  # fmt: skip
        liveness = Liveness(self.env.url, SCHEMA, WORKER_CFG, registration, on_lost=_noop_lost, on_rejoined=_noop)
        before = self.snapshot()
        try:
            worker_id = self.env.run(liveness.start())
        except NameInUseError:
            event("worker start refused: name in use")
            assert old is not None, name
            assert old.state == "hung", old
            self.env.run(liveness._drop_connection())
            return
        assert old is None or (old.state, old.worker_id) == ("killed", worker_id), (old, worker_id)
        proc = Proc(name, liveness, worker_id, capacity, frozenset(actions), runtimes)
        self.procs[name] = proc
        self.every_proc.append(proc)
        after = self.snapshot()
        for eid, was in before.executions.items():
            now = after.executions[eid]
            if was["worker"] == worker_id and was["status"] in ("running", "canceling"):
                event("worker restart detached a run")
                assert (now["status"], now["worker"]) == (was["status"], None), now
            else:
                assert (now["status"], now["worker"]) == (was["status"], was["worker"]), now

    def on_start_worker(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(WORKER_NAMES), label="name")
        self.start_worker(name, *data.draw(WORKER_SPECS, label="spec"))

    def on_kill_worker(self, data: st.DataObject) -> None:
        """The process dies: the server drops its session, and the liveness lock with it."""
        if not self.acting():
            return
        proc = data.draw(st.sampled_from(self.acting()), label="proc")
        self.env.run(proc.liveness._drop_connection())
        self.gone(proc)

    def gone(self, proc: Proc) -> None:
        """The process is gone once the server has dropped its session (the backend
        exits, and unlocks, asynchronously)."""
        for _ in range(500):
            held = self.env.conn.execute("SELECT worker_lock_held(%s) AS held", (proc.worker_id,)).fetchone()
            if held is not None and not held["held"]:
                break
            self.env.run(asyncio.sleep(0.01))
        else:
            pytest.fail(f"lock of worker {proc.worker_id} still held after its connection closed")
        proc.state, proc.runs = "killed", {}

    def on_stop_worker(self, data: st.DataObject) -> None:
        """A graceful shutdown past its timeout, as the worker service does it: draining,
        its not-yet-started work handed back (under the assignment lock), the runs it had
        to stop released (fenced on worker and attempt), then inactive and gone."""
        if not self.acting("alive"):
            return
        proc = data.draw(st.sampled_from(self.acting("alive")), label="proc")
        wid, c = proc.worker_id, self.env.conn
        before = self.snapshot()
        with c.transaction():
            c.execute(Q["lock_assignment"])
            c.execute(Q["set_worker_status"], {"id": wid, "status": "draining"})
            back = c.execute(Q["hand_back_scheduled"], {"worker": wid}).fetchall()
        decisions = Decisions()
        for eid, attempt in proc.runs.items():
            decisions.add({"id": eid, "attempt": attempt}, "requested", None, "worker shut down")
        params = decisions.params(worker=wid, outcome="interrupted", by="worker", from_statuses=["running"])
        released = c.execute(Q["resolve_attempts"], params).fetchall() if decisions.ids else []
        runs = dict(proc.runs)
        self.env.run(proc.liveness.close("inactive"))
        self.gone(proc)
        after = self.snapshot()
        scheduled = {eid for eid, e in before.executions.items() if e["status"] == "scheduled" and e["worker"] == wid}
        assert {r["id"] for r in back} == scheduled
        running = {
            eid
            for eid, attempt in runs.items()
            if (before.executions[eid]["status"], before.executions[eid]["worker"], before.executions[eid]["attempt"])
            == ("running", wid, attempt)
        }
        assert {r["id"] for r in released} == running
        for eid in scheduled | running:
            was, now = before.executions[eid], after.executions[eid]
            assert (now["status"], now["worker"]) == ("requested", None), now
            assert now["attempt"] == was["attempt"] - (eid in scheduled), (was, now)
        assert after.workers[wid]["status"] == "inactive"
        if released:
            event("stopped worker released its runs")

    def on_hang_worker(self, data: st.DataObject) -> None:
        """The process hangs or is cut off: no heartbeat, but its session and lock remain
        and it may still write later."""
        if not self.acting("alive"):
            return
        proc = data.draw(st.sampled_from(self.acting("alive")), label="proc")
        self.env.conn.execute(
            "UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (proc.worker_id,)
        )
        proc.state = "hung"

    def on_resume_worker(self, data: st.DataObject) -> None:
        """The hung process heartbeats again. If an executor declared it dead meanwhile,
        it rejoins (as its liveness loop does) and hands the runs it stopped to the sweep
        with ``detach_runs`` -- which must touch nothing: they were recovered (fenced)."""
        if not self.acting("hung"):
            return
        proc = data.draw(st.sampled_from(self.acting("hung")), label="proc")
        beat = self.env.conn.execute(Q["heartbeat"], {"id": proc.worker_id}).fetchone()
        event(f"hung worker resumes {'after' if beat is None else 'before'} being declared dead")
        if beat is None:
            self.env.run(proc.liveness._register())
            detached = self.env.conn.execute(
                Q["detach_runs"],
                {"ids": list(proc.runs), "attempts": list(proc.runs.values()), "worker": proc.worker_id},
            ).fetchall()
            assert detached == [], detached
            proc.runs = {}
        proc.state = "alive"

    def on_drain_worker(self, data: st.DataObject) -> None:
        """``workers drain``: cordoned, its not-yet-started work handed back."""
        if not self.procs:
            return
        name = data.draw(st.sampled_from(sorted(self.procs)), label="name")
        wid = self.procs[name].worker_id
        before = self.snapshot()
        on_it = [eid for eid, e in before.executions.items() if e["status"] == "scheduled" and e["worker"] == wid]
        assert self.env.client.drain(name) == len(on_it)
        for eid in on_it:
            now = self.execution(eid)
            assert (now["status"], now["attempt"]) == ("requested", before.executions[eid]["attempt"] - 1)
        self.cordoned.add(name)

    def on_uncordon_worker(self, data: st.DataObject) -> None:
        if self.cordoned:
            name = data.draw(st.sampled_from(sorted(self.cordoned)), label="name")
            self.env.client.cordon(name, False)
            self.cordoned.discard(name)

    def on_claim(self, data: st.DataObject) -> None:
        """The worker takes what was dispatched to it, up to its free slots. Repeated, it
        is a duplicate dispatch message: nothing is started twice."""
        if not self.acting():
            return
        proc = data.draw(st.sampled_from(self.acting()), label="proc")
        free = proc.capacity - len(proc.runs)
        if free <= 0:
            return
        before = self.snapshot()
        mine = [
            eid for eid, e in before.executions.items() if e["status"] == "scheduled" and e["worker"] == proc.worker_id
        ]
        rows = self.env.conn.execute(Q["claim_scheduled"], {"worker": proc.worker_id, "limit": free}).fetchall()
        assert sorted(r["id"] for r in rows) == mine[:free]  # oldest first
        for r in rows:
            event("claim: started a run")
            assert r["attempt"] == before.executions[r["id"]]["attempt"]
            assert proc.runs.get(r["id"]) != r["attempt"], f"{r['id']} attempt {r['attempt']} started twice"
            proc.runs[r["id"]] = r["attempt"]
            now = self.execution(r["id"])
            assert (now["status"], now["worker"]) == ("running", proc.worker_id)

    def deliver(self, result: Result) -> bool:
        """Send one result through ``finish``: it must be taken exactly when the row is
        still this worker's run of this attempt, and change nothing otherwise."""
        was = self.execution(result.execution)
        written = self.env.conn.execute(Q["finish"], result.params()).fetchall()
        return self.check_result(result, was, written)

    def check_result(self, result: Result, was: Row, written: list[Row]) -> bool:
        expected = (was["status"] in ("running", "canceling") and was["worker"] == result.proc.worker_id
                    and was["attempt"] == result.attempt)  # fmt: skip
        accepted = [r["id"] for r in written] == [result.execution]
        assert accepted == expected, (result, was, written)
        now = self.execution(result.execution)
        if not accepted:
            assert now == was, "a refused result changed the row"
            return False
        cancelled = was["status"] == "canceling"  # the cancel asked for wins over the run's outcome
        assert now["status"] == ("cancelled" if cancelled else result.status), now
        closed = self.attempt_row(result.execution, result.attempt)
        assert closed is not None
        assert closed["ended"] is not None
        assert closed["outcome"] == ("cancelled" if cancelled else result.outcome)
        if now["status"] == "requested":
            assert now["worker"] is None
            assert now["not_before"] is not None
        return True

    def finish(self, data: st.DataObject, late: bool) -> None:
        """A run ends (a retry asks for another attempt at once). ``late``: the result
        names the previous attempt, as a writer from before a re-dispatch would."""
        procs = [p for p in self.acting() if p.runs]
        if not procs:
            return
        proc = data.draw(st.sampled_from(procs), label="proc")
        eid = data.draw(st.sampled_from(sorted(proc.runs)), label="execution")
        outcome = data.draw(st.sampled_from(["completed", "failed", "timeout", "retry"]), label="outcome")
        attempt = proc.runs[eid] - 1 if late else proc.runs.pop(eid)
        status, delay = ("requested", 0.0) if outcome == "retry" else (outcome, None)
        result = Result(proc, eid, attempt, status, "failed" if outcome == "retry" else outcome, delay)
        taken = self.deliver(result)
        event(f"{'late ' if late else ''}result {'taken' if taken else 'refused'}")
        self.results.append(result)

    def on_finish(self, data: st.DataObject) -> None:
        self.finish(data, late=False)

    def on_finish_late(self, data: st.DataObject) -> None:
        self.finish(data, late=True)

    def on_cancel_during_result(self, data: st.DataObject) -> None:
        """Two writers at once: the API's cancel of one execution, not yet committed, while
        a worker's result for another is written on another connection (it may wait for
        the cancel's locks). The outcome must be that of the cancel, then the result."""
        procs = [p for p in self.acting() if p.runs]
        if not procs:
            return
        proc = data.draw(st.sampled_from(procs), label="proc")
        eid = data.draw(st.sampled_from(sorted(proc.runs)), label="execution")
        others = sorted(set(self.requested) - {eid})
        if not others:
            return
        # Half the time one of the first waiters for the slot this result may free.
        waiters = [
            r["execution"]
            for r in self.env.conn.execute(
                "SELECT q.execution FROM execution_admission_queue q JOIN execution_admission_slot s"
                " USING (policy, group_key) WHERE s.execution = %s ORDER BY q.seq LIMIT 2",
                (eid,),
            ).fetchall()
        ]
        candidates = (
            st.one_of(st.sampled_from(waiters), st.sampled_from(others)) if waiters else st.sampled_from(others)
        )
        victim = data.draw(candidates, label="cancelled")
        result = Result(proc, eid, proc.runs.pop(eid), "completed", "completed", None)
        before, was = self.execution(victim), self.execution(eid)
        other = self.env.other
        with other.transaction():
            row = other.execute(Q["cancel_execution"], {"id": victim, "by": "model"}).fetchone()
            self.writer_pid = None
            writing = self.env.loop.create_task(self.write_async(result))
            self.env.run(self.until_done_or_waiting(writing))
        written = self.env.run(writing)
        assert row is not None
        self.check_cancel(before, row["now"])
        self.check_result(result, was, written)
        self.results.append(result)

    async def write_async(self, result: Result) -> list[Row]:
        async with self.env.pool.connection() as conn:
            self.writer_pid = conn.info.backend_pid
            return await (await conn.execute(Q["finish"], result.params())).fetchall()

    async def until_done_or_waiting(self, task: asyncio.Task[Any]) -> None:
        """Until ``task`` has finished, or its statement waits for a lock (so it began
        before the other transaction commits, whatever the machine's speed)."""
        for _ in range(1000):
            if task.done():
                return
            if self.writer_pid is not None:
                waiting = self.env.conn.execute(
                    "SELECT wait_event_type = 'Lock' AS waiting FROM pg_stat_activity WHERE pid = %s",
                    (self.writer_pid,),
                ).fetchone()
                if waiting and waiting["waiting"]:
                    event("result waited for the cancel's locks")
                    return
            await asyncio.sleep(0.005)
        pytest.fail("the result neither finished nor waited for a lock")

    def on_result_again(self, data: st.DataObject) -> None:
        """The same result message again: whatever became of the first, never taken now."""
        if self.results:
            assert not self.deliver(data.draw(st.sampled_from(self.results), label="result"))

    def on_honour_cancels(self, data: st.DataObject) -> None:
        """The worker's cancellation check: each of its executions being cancelled is
        stopped and finished as cancelled."""
        if not self.acting():
            return
        proc = data.draw(st.sampled_from(self.acting()), label="proc")
        for r in self.env.conn.execute(Q["canceling_on_worker"], {"worker": proc.worker_id}).fetchall():
            event("worker stopped a cancelled run")
            assert self.deliver(Result(proc, r["id"], r["attempt"], "cancelled", "cancelled", None))
            proc.runs.pop(r["id"], None)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if self.ready:
            self.check(self.snapshot())
            self.settled = True

    def check(self, s: Snap) -> None:
        assert set(s.executions) == set(self.requested), "an execution appeared or vanished"
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
                assert eid in self.stuck, e
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
        for proc in self.acting("alive"):
            assert s.workers[proc.worker_id]["status"] == "active", s.workers[proc.worker_id]
        self.check_admission(s)

    def check_admission(self, s: Snap) -> None:
        """Per group, in request order, the live (non-terminal) executions: under enqueue
        the first ``concurrency`` hold a slot and the others wait; under cancel each holds
        one. Terminal and ungoverned executions hold nothing."""
        members: dict[tuple[str, str], list[int]] = defaultdict(list)
        for eid, r in sorted(self.requested.items()):
            if r.policy is not None and r.group is not None and s.executions[eid]["status"] not in TERMINAL:
                members[(r.policy, r.group)].append(eid)
        holders: dict[int, tuple[str, str]] = {}
        waiters: dict[int, tuple[str, str]] = {}
        for key, live in members.items():
            policy = self.policies[key[0]]
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
            for proc in self.every_proc:
                self.env.run(proc.liveness._drop_connection())

    def drain(self) -> None:
        """Every worker dies, the sweep recovers their work, a fresh worker runs the rest:
        everything ends (no waiter is left behind), and every slot and queue row with it."""
        if self.stuck:
            self.env.run(self.schedulers["A"].reclaim_stale(1e-6))
            self.stuck.clear()
        for proc in self.acting():
            self.env.run(proc.liveness._drop_connection())
            proc.state, proc.runs = "killed", {}
        self.env.conn.execute("UPDATE worker SET last_heartbeat = now() - interval '1 hour'")
        self.env.run(self.recovery.sweep())
        registration = {
            "name": "drain", "runtimes": ["python", "shell"], "actions": list(PYTHON_ACTIONS),
            "capabilities": Jsonb({}), "capacity": 10, "host": "model", "pid": 0, "version": conveyor.__version__,
        }  # fmt: skip
        liveness = Liveness(self.env.url, SCHEMA, WORKER_CFG, registration, on_lost=_noop_lost, on_rejoined=_noop)
        worker_id = self.env.run(liveness.start())
        self.every_proc.append(Proc("drain", liveness, worker_id, 10, frozenset(PYTHON_ACTIONS), ("python", "shell")))
        busy = "SELECT 1 FROM execution WHERE status <> ALL(%s)"
        for _ in range(len(self.requested) + 5):  # each pass ends at least one per group
            if not self.env.conn.execute(busy, (list(TERMINAL),)).fetchone():
                break
            self.env.run(self.schedulers["A"].run_round())
            runs = self.env.conn.execute(Q["claim_scheduled"], {"worker": worker_id, "limit": 10}).fetchall()
            # One batch, as the worker's result writer sends them.
            n = len(runs)
            written = self.env.conn.execute(
                Q["finish"],
                {
                    "worker": worker_id, "ids": [r["id"] for r in runs], "attempts": [r["attempt"] for r in runs],
                    "statuses": ["completed"] * n, "outcomes": ["completed"] * n, "delays": [None] * n,
                    "results": [Jsonb({"succeeded": True})] * n, "errors": [None] * n,
                },
            ).fetchall()  # fmt: skip
            assert sorted(r["id"] for r in written) == sorted(r["id"] for r in runs)
        s = self.snapshot()
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
