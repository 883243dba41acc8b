"""A chaos run from start to report: a private PostgreSQL (restartable: the shared server
is never touched), migrated with ``conveyor migrate``; executor replicas and workers as
real processes on the chosen transport; load, faults and duplicates for a bounded time;
then a settle phase (nothing more breaks, every process is back) and the checks.

Every process, the private server and the run's RabbitMQ objects are removed at the end,
whatever happened (``run_chaos``'s ``finally``).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from acceptance import mq
from acceptance.helpers import conveyor_env, describe, run_cli
from acceptance.pg import PrivatePostgres
from conveyor.ops import failpoints

from . import automation
from . import report as reporting
from . import workflows as chaos_workflows
from .dupes import BrokerDuplicator, NotifyDuplicator, delete_tap
from .faults import Injector, Monitor, Outages, Timing, connect
from .fleet import Fleet
from .load import Canceller, Submitter

TESTS = Path(__file__).resolve().parent.parent

# Heartbeat 1 s (FAST_SETTINGS): staleness 3 s, self-fencing after 2 s. Quick sweeps;
# a claim stranded by a dead executor is reclaimed after 5 s; dispatches expire (dead
# letters) after 10 s in a worker's queue; the RabbitMQ reconciler runs every 2 s.
SETTINGS = {
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    "CONVEYOR__EXECUTOR__NO_WORKER_GRACE": "30",
    "CONVEYOR__EXECUTOR__CLAIM_TIMEOUT": "5",
    "CONVEYOR__EXECUTOR__TIMEOUT_CHECK_INTERVAL": "1",
    "CONVEYOR__EXECUTOR__ADMISSION_REPAIR_INTERVAL": "1",
    "CONVEYOR__DEAD_LETTER__CHECK_INTERVAL": "1",
    "CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_TTL_MS": "10000",
    "CONVEYOR__MESSAGE_QUEUE__RECONCILE_AFTER": "4",
    "CONVEYOR__DATABASE__POOL_SIZE": "6",
}
LEDGER = """
CREATE TABLE public.chaos_ledger (
    id        bigserial PRIMARY KEY,
    token     uuid NOT NULL UNIQUE,
    execution bigint NOT NULL,
    attempt   integer NOT NULL,
    worker    text NOT NULL,
    pid       integer NOT NULL,
    action    text NOT NULL,
    started   timestamptz NOT NULL,
    ended     timestamptz,
    outcome   text
);
CREATE INDEX ON public.chaos_ledger (execution);
CREATE TABLE public.chaos_submission (
    n         bigint PRIMARY KEY,
    execution bigint NOT NULL,
    action    text NOT NULL,
    submitted timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE public.chaos_process (
    pid     integer PRIMARY KEY,
    member  text NOT NULL,
    role    text NOT NULL,
    started timestamptz NOT NULL,
    died    timestamptz,
    cause   text
);
"""


class Unavailable(Exception):
    """A service the run needs is missing (PostgreSQL binaries, RabbitMQ, rabbitmqctl)."""


@dataclass
class ChaosConfig:
    transport: str = "postgres"  # postgres | rabbitmq
    duration: float = 45.0  # seconds of load and faults
    executors: int = 3
    workers: int = 4
    rate: float = 40.0  # executions requested per second
    concurrency: int = 8  # per worker
    seed: int | None = None
    pg_restart_mode: str = "fast"  # fast | immediate
    broker_down: float = 1.0  # seconds between stop_app and start_app
    failpoints: bool = True
    cancel_every: float = 0.5
    settle_timeout: float = 120.0
    webhook_rate: float = 4.0  # signed webhook deliveries POSTed per second
    event_rate: float = 4.0  # custom events emitted per second
    timing: Timing = field(default_factory=Timing)
    rabbitmq_url: str = field(
        default_factory=lambda: os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    mq_prefix: str = field(default_factory=lambda: f"chaos{uuid.uuid4().hex[:8]}")
    log_dir: Path | None = None


@dataclass
class ChaosResult:
    report: str
    violations: list[str]
    figures: dict[str, object]
    log_dir: Path


def _probe_services(config: ChaosConfig) -> None:
    if config.transport != "rabbitmq":
        return
    problem = mq.rabbitmqctl_problem()
    if problem:
        raise Unavailable(problem)
    import asyncio

    import aio_pika

    async def probe() -> None:
        connection = await aio_pika.connect(config.rabbitmq_url, timeout=5)
        await connection.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        raise Unavailable(f"no RabbitMQ at {config.rabbitmq_url}: {exc}") from exc


def _start_server() -> PrivatePostgres:
    pg = PrivatePostgres(settings={"max_connections": 400})
    try:
        pg.init()
        pg.start()
    except (subprocess.SubprocessError, OSError) as exc:
        logs = pg.logs()
        pg.destroy()
        raise Unavailable(f"cannot start a private PostgreSQL: {exc}\n{logs}") from exc
    return pg


def _env(config: ChaosConfig, db_url: str, spill: Path) -> dict[str, str]:
    extra: dict[str, object] = {**SETTINGS}
    if config.transport == "rabbitmq":
        extra.update({
            "CONVEYOR__TRANSPORT": "rabbitmq",
            "CONVEYOR__MESSAGE_QUEUE__URL": config.rabbitmq_url,
            "CONVEYOR__MESSAGE_QUEUE__PREFIX": config.mq_prefix,
        })  # fmt: skip
    env = conveyor_env(db_url, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env["CHAOS_SPILL_DIR"] = str(spill)
    return env


def _build_fleet(config: ChaosConfig, env: dict[str, str], log_dir: Path, rng: random.Random) -> Fleet:
    fleet = Fleet(log_dir)
    for i in range(1, config.executors + 1):
        # Half the replicas run the recovery duties one at a time (exclusive_duties), the
        # others on every replica: both must be safe side by side.
        exclusive = {"CONVEYOR__EXECUTOR__EXCLUSIVE_DUTIES": "true" if i % 2 else "false"}
        fleet.add("executor", f"e{i}", ["executor"], {**env, **exclusive})
    # The webhooks' door (never killed: the injector picks only executors and workers).
    api_env = {**env, "CONVEYOR__API__HOST": "127.0.0.1", "CONVEYOR__API__PORT": str(automation.free_port())}
    fleet.add("api", "api", ["api"], api_env)
    for i in range(1, config.workers + 1):
        name = f"chaos-w{i}"
        args = ["worker", "--name", name, "--import", "chaos.actions", "--concurrency", str(config.concurrency)]
        fleet.add("worker", name, args, env)
    if config.failpoints:
        # Crashes at exact protocol points, each in one incarnation (the next one of the
        # same member gets the next); the injector restarts them like any other death.
        # Points are named in conveyor/ops/failpoints.py's docstring; the first known of each
        # list is used (a renamed point is noticed here, not silently never reached).
        def point(*names: str) -> str:
            found = next((n for n in names if n in known), None)
            if found is None:
                raise RuntimeError(
                    f"none of the failpoints {names} is known to conveyor.ops.failpoints: {sorted(known)}"
                )
            return found

        known = set(re.findall(r"``([a-z_]+\.[a-z_]+)``", failpoints.__doc__ or ""))
        second = (
            point("relay.before_dispatch_publish", "relay.before_publish")
            if config.transport == "rabbitmq"
            else point("scheduler.after_dispatch")
        )
        fleet.failpoint_plan[f"e{config.executors}"] = [
            f"{point('scheduler.after_claim')}@{rng.randint(30, 60)}",
            # Relays share the outbox and publish in batches: fewer passes to count.
            f"{second}@{rng.randint(3, 8) if config.transport == 'rabbitmq' else rng.randint(20, 40)}",
        ]
        # Another replica dies inside a workflow's advancement (children requested, not
        # committed), then its next incarnation with the advancement committed. Low counts:
        # advancements are batched (one pass advances many workflows), so a slow machine
        # makes few passes, and a point never reached fails the run.
        if config.executors > 1:
            fleet.failpoint_plan[f"e{config.executors - 1}"] = [
                f"{point('workflow.after_child_row')}@{rng.randint(4, 12)}",
                f"{point('workflow.before_commit')}@{rng.randint(4, 12)}",
            ]
        # The rules' event pass and the schedules' slot pass, one point of each in a random
        # order (e1's first two incarnations).
        firsts = [f"{point(rng.choice(automation.EVENT_POINTS))}@{rng.randint(5, 20)}",
                  f"{point(rng.choice(automation.SCHEDULE_POINTS))}@{rng.randint(5, 15)}"]  # fmt: skip
        rng.shuffle(firsts)
        if config.executors > 2:
            fleet.failpoint_plan["e1"] = firsts
        worker_point = point("worker.before_result_commit")
        fleet.failpoint_plan[f"chaos-w{config.workers}"] = [f"{worker_point}@{rng.randint(30, 50)}"]
    return fleet


def _wait(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return True
        except psycopg.Error:
            pass  # the server restarting: ask again
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _start_all(fleet: Fleet, rabbitmq: bool) -> None:
    for member in fleet.members.values():
        fleet.start(member)
    for member in fleet.members.values():
        inc = member.current
        started = {"executor": "executor started", "worker": "worker registered", "api": "API listening"}
        inc.proc.wait_for_log(started[member.role], timeout=90)
        if rabbitmq and member.role != "api":
            inc.proc.wait_for_log("connected to RabbitMQ", timeout=60)


def _one(conn: psycopg.Connection[dict[str, Any]], query: str, params: Any = None) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row["n"]) if row else 0


def _settled(url: str, rabbitmq: bool, fleet: Fleet) -> Callable[[], bool]:
    def check() -> bool:
        if any(not m.alive for m in fleet.members.values()):
            return False
        with connect(url) as conn:
            queries = [
                "SELECT count(*) AS n FROM execution_admission_slot",
                "SELECT count(*) AS n FROM execution_admission_queue",
                "SELECT count(*) AS n FROM dead_letter WHERE resolution IS NULL",
                "SELECT count(*) AS n FROM worker WHERE status <> 'active' "
                "OR last_heartbeat < now() - make_interval(secs => stale_after)",
            ]
            queries.append("SELECT count(*) AS n FROM workflow_event")  # replays of ended ones consumed
            queries.append("SELECT count(*) AS n FROM event_pending")  # every event enforced
            if rabbitmq:
                queries.append("SELECT count(*) AS n FROM outbox")
            live = [m.current.pid for m in fleet.members.values()]
            open_runs = "SELECT count(*) AS n FROM public.chaos_ledger WHERE ended IS NULL AND pid = ANY(%s)"
            return all(_one(conn, q) == 0 for q in queries) and _one(conn, open_runs, (live,)) == 0

    return check


def run_chaos(config: ChaosConfig, progress: Callable[[str], None] = print) -> ChaosResult:
    seed = config.seed if config.seed is not None else random.randrange(1_000_000)
    rng = random.Random(seed)
    rabbitmq = config.transport == "rabbitmq"
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix=f"conveyor-chaos-{config.transport}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    spill = log_dir / "spill"
    spill.mkdir(exist_ok=True)
    _probe_services(config)
    pg = _start_server()
    fleet: Fleet | None = None
    threads: list[object] = []
    try:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        db_url = psycopg.conninfo.make_conninfo(pg.url, dbname="chaos")
        env = _env(config, db_url, spill)
        migrated = run_cli("migrate", env=env, timeout=120)
        if migrated.returncode != 0:
            raise RuntimeError(describe(migrated))
        with connect(db_url) as conn:
            conn.execute(LEDGER)
        fleet = _build_fleet(config, env, log_dir / "processes", rng)
        progress(f"chaos: {config.transport}, seed {seed}, logs in {log_dir}; starting processes")
        _start_all(fleet, rabbitmq)
        policies = reporting.ensure_policies(db_url)
        with connect(db_url) as conn:
            chaos_workflows.register(conn)  # their actions exist now: the workers registered them
        automation.set_up(db_url)

        monitor = Monitor(db_url, rabbitmq)
        injector = Injector(fleet, db_url, rng.randrange(1 << 30), config.timing, {"executor": 1, "worker": 2})
        # The broker's restart takes longest (stop_app, start_app, await_startup: 10-20 s
        # on a busy machine): first, so that it ends within the window.
        broker_at = config.duration * rng.uniform(0.2, 0.35) if rabbitmq else None
        pg_at = config.duration * (rng.uniform(0.6, 0.75) if rabbitmq else rng.uniform(0.3, 0.5))
        outages = Outages(pg, config.pg_restart_mode, pg_at, broker_at, config.broker_down)
        submitter = Submitter(db_url, config.rate, rng.randrange(1 << 30))
        canceller = Canceller(db_url, config.cancel_every, rng.randrange(1 << 30))
        notify_dupes = NotifyDuplicator(db_url)
        bot = chaos_workflows.InquiryBot(db_url)  # answers until the end: workflows wait on it
        sender = automation.WebhookSender(
            automation.api_url(fleet.members["api"].env), config.webhook_rate, rng.randrange(1 << 30)
        )
        emitter = automation.EventEmitter(db_url, config.event_rate, rng.randrange(1 << 30))
        broker_dupes = (
            BrokerDuplicator(config.rabbitmq_url, db_url, config.mq_prefix, rng.randrange(1 << 30))
            if rabbitmq
            else None
        )
        threads = [t for t in (monitor, injector, outages, submitter, canceller, notify_dupes, broker_dupes, bot) if t]
        threads += [sender, emitter]
        began = time.time()
        injector.chaos.set()
        outages.begin.set()
        for t in threads:
            t.start()  # type: ignore[attr-defined]
        progress(f"chaos: {config.duration:g}s of load and faults")
        time.sleep(config.duration)

        submitter.stop.set()
        canceller.stop.set()
        sender.stop.set()
        emitter.stop.set()
        notify_dupes.stop.set()
        if broker_dupes is not None:
            broker_dupes.stop.set()
        injector.end_chaos()
        chaos_ended = time.time()
        outages.join(timeout=300)  # a broker restart under way finishes (it always starts the broker again)
        submitter.join(timeout=30)
        canceller.join(timeout=30)
        sender.join(timeout=30)
        emitter.join(timeout=30)
        _wait(lambda: automation.pause_schedules(db_url), 30, 0.5)  # nothing more requested
        progress(f"chaos: over; {len(submitter.confirmed)} executions requested, waiting for them to end")

        def all_terminal() -> bool:
            with connect(db_url) as conn:
                return _one(conn, "SELECT count(*) AS n FROM execution WHERE status <> ALL(terminal_statuses())") == 0

        terminal_in_time = _wait(all_terminal, config.settle_timeout, 0.5)
        terminal_at = time.time()
        progress(f"chaos: every execution ended {terminal_at - chaos_ended:.1f}s after the chaos; settling")
        settled_in_time = _wait(_settled(db_url, rabbitmq, fleet), 30, 0.5)
        settled = time.time()
        injector.stop.set()
        monitor.stop.set()
        bot.stop.set()
        for t in threads:
            t.join(timeout=30)  # type: ignore[attr-defined]

        return reporting.build(
            reporting.Inputs(
                config=config,
                seed=seed,
                db_url=db_url,
                fleet=fleet,
                began=began,
                chaos_ended=chaos_ended,
                terminal_at=terminal_at,
                settled=settled,
                terminal_in_time=terminal_in_time,
                settled_in_time=settled_in_time,
                injector=injector,
                outages=outages,
                monitor=monitor,
                submitter=submitter,
                canceller=canceller,
                bot=bot,
                sender=sender,
                emitter=emitter,
                notify_dupes=notify_dupes,
                broker_dupes=broker_dupes,
                policies=policies,
                spill=spill,
                log_dir=log_dir,
            )
        )
    finally:
        for t in threads:
            t.stop.set()  # type: ignore[attr-defined]
        for t in threads:
            if isinstance(t, Outages) and t.is_alive():  # a restart under way ends with the server up
                t.join(timeout=300)
        if fleet is not None:
            fleet.kill_all()
        pg.destroy()
        if rabbitmq:
            _delete_broker_objects(config)


def _delete_broker_objects(config: ChaosConfig) -> None:
    from conftest import delete_broker_objects

    try:
        delete_broker_objects(config.rabbitmq_url, config.mq_prefix)
        delete_tap(config.rabbitmq_url, config.mq_prefix)
    except Exception as exc:  # the broker itself may be what failed
        print(f"chaos: could not delete RabbitMQ objects of prefix {config.mq_prefix}: {exc}")
