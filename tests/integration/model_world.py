"""The model test's world: its settings, the event weights, the records the model keeps
of what it decided (worker processes, results, dispatches, policies, requests), and the
``World`` that holds them and reads the database."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from hypothesis import event
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings, WorkerSettings
from conveyor.domain.status import ON_WORKER as ON_WORKER
from conveyor.domain.status import TERMINAL as TERMINAL
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.executor.recovery import Recovery
from conveyor.executor.scheduler import Scheduler
from conveyor.sdk import Client
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.liveness import Liveness

Conn = psycopg.Connection[dict[str, Any]]
Pool = AsyncConnectionPool[Any]
Row = dict[str, Any]
T = TypeVar("T")

SCHEMA = "conveyor"
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

# Each example starts from these tables emptied (actions and migrations stay). The sweep
# counts a heartbeat's age from this server lifetime's start at the earliest (recovery.sql):
# that start is moved a day back, so that a heartbeat the model makes an hour old (a hung
# worker, the drain at teardown) is stale however long the server has been up.
RESET = (
    "TRUNCATE execution, execution_attempt, worker, outbox, dead_letter, admission_policy,"
    " execution_admission_group, execution_admission_slot, execution_admission_queue RESTART IDENTITY CASCADE;"
    " SELECT stamp_server_epoch(); UPDATE server_epoch SET epoch = LEAST(epoch, now() - interval '1 day')"
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


class World:
    """What the model knows, shared by the state machine (test_model.Model) and its two
    kits of events (model_executors, model_workers): what the test decided (policies,
    requests, worker processes, the messages sent) and the executor parts it drives; and
    how it reads the database."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.policies: dict[str, Policy] = {}
        self.echo_values: tuple[str, ...] = ("a", "b")
        self.requested: dict[int, Requested] = {}
        self.procs: dict[str, Proc] = {}  # the latest process of each worker name
        self.every_proc: list[Proc] = []  # to close their connections at teardown
        self.cordoned: set[str] = set()
        self.stuck: set[int] = set()  # claims left in scheduling by crashed replicas
        self.dispatches: list[Dispatch] = []
        self.results: list[Result] = []
        self.dead_letters: dict[str, str] = {}  # dedupe key -> first resolution
        self.grace = 0.0
        self.schedulers: dict[str, Scheduler] = {}
        self.recovery = Recovery(env.pool, SETTINGS)
        self.dead_letter_handler = DeadLetterHandler(env.pool, env.transport, SETTINGS, "ex-A")

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
    return [r.id for r in rows]


async def noop() -> None:
    return None


async def noop_lost(reason: str) -> None:
    return None
