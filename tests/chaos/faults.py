"""Faults for a bounded time: SIGKILLs of random executors and workers (restarted under
the same name after a short random delay), crashes at failpoints, one PostgreSQL restart,
one RabbitMQ restart; every fault recorded with what it left stranded."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from acceptance import mq
from acceptance.pg import PrivatePostgres

from .fleet import Fleet, Incarnation, Member

SCHEMA = "conveyor"


def connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(
        url,
        autocommit=True,
        row_factory=dict_row,
        connect_timeout=3,
        options=f"-c search_path={SCHEMA},public",
        application_name="chaos-harness",
    )


@dataclass
class Fault:
    kind: str  # sigkill | failpoint <point> | exited <code> | postgresql restart | rabbitmq restart
    target: str  # member name, "postgresql" or "rabbitmq"
    role: str  # executor | worker | server
    at: float  # unix time of the kill (or the outage's start)
    pid: int | None = None
    until: float | None = None  # outages: when the server was back
    # (execution, status, attempt) on the dead process at its death; None: unknown
    stranded: list[tuple[int, str, int]] | None = None
    restarted: float | None = None  # the next incarnation's start
    next_pid: int | None = None


@dataclass
class Timing:
    kill_every: tuple[float, float] = (1.5, 4.0)
    restart_after: tuple[float, float] = (0.2, 3.0)


class Injector(threading.Thread):
    """Kills during the chaos window (``chaos`` set) and restarts whatever died, also
    after the window (failpoint crashes, refusals), until ``stop``."""

    def __init__(self, fleet: Fleet, url: str, seed: int, timing: Timing, min_alive: dict[str, int]) -> None:
        super().__init__(name="chaos-injector", daemon=True)
        self.fleet = fleet
        self.url = url
        self.rng = random.Random(seed)
        self.timing = timing
        self.min_alive = min_alive
        self.chaos = threading.Event()
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.refusals: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def run(self) -> None:
        try:
            next_kill = time.monotonic() + self.rng.uniform(*self.timing.kill_every)
            while not self.stop.wait(0.05):
                for inc in self.fleet.reap():
                    self._ended_alone(inc)
                for inc in self.fleet.restart_due():
                    self._restarted(inc)
                if self.chaos.is_set() and time.monotonic() >= next_kill:
                    self._kill_one()
                    next_kill = time.monotonic() + self.rng.uniform(*self.timing.kill_every)
        except BaseException as exc:
            self.error = exc
        finally:
            if self._conn is not None:
                self._conn.close()

    def end_chaos(self) -> None:
        """No more kills or failpoints; what is down comes back now."""
        self.chaos.clear()
        self.fleet.arming = False
        for member in self.fleet.dead():
            self.fleet.schedule_restart(member, 0.0)

    def _kill_one(self) -> None:
        victim = self.fleet.pick_victim(self.rng, self.min_alive)
        if victim is None:
            return
        inc = self.fleet.kill(victim)
        self._record(Fault("sigkill", victim.name, victim.role, inc.died or time.time(), pid=inc.pid), victim)
        self.fleet.schedule_restart(victim, self.rng.uniform(*self.timing.restart_after))

    def _ended_alone(self, inc: Incarnation) -> None:
        member = self.fleet.members[inc.member]
        if inc.cause in ("name held", "no database"):
            # Refused to start (the old session still holds the name; the server is
            # restarting): a supervisor retries, so does the harness.
            self.refusals[inc.cause] += 1
            self.fleet.schedule_restart(member, 1.0)
            return
        self._record(
            Fault(inc.cause or "exited", member.name, member.role, inc.died or time.time(), pid=inc.pid), member
        )
        self.fleet.schedule_restart(member, 0.5)

    def _restarted(self, inc: Incarnation) -> None:
        with self.lock:
            for fault in reversed(self.faults):
                if fault.target == inc.member and fault.restarted is None:
                    fault.restarted, fault.next_pid = inc.started, inc.pid
                    break

    def _record(self, fault: Fault, member: Member) -> None:
        fault.stranded = self._stranded(member, fault.pid)
        with self.lock:
            self.faults.append(fault)

    def _stranded(self, member: Member, pid: int | None) -> list[tuple[int, str, int]] | None:
        """What the dead process left behind: a worker's scheduled and running executions,
        an executor's claims. None when the database cannot say (it is restarting)."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.url)
            if member.role == "worker":
                rows = self._conn.execute(
                    "SELECT e.id, e.status, e.attempt FROM execution e JOIN worker w ON w.id = e.worker "
                    "WHERE w.name = %s AND e.status IN ('scheduled', 'running', 'canceling')",
                    (member.name,),
                ).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT id, status, attempt FROM execution WHERE status = 'scheduling' AND executor LIKE %s",
                    (f"%:{pid}:%",),
                ).fetchall()
        except psycopg.Error:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return None
        return [(r["id"], r["status"], r["attempt"]) for r in rows]


class Outages(threading.Thread):
    """Restart PostgreSQL once and RabbitMQ once, at the given offsets into the window."""

    def __init__(
        self, pg: PrivatePostgres, pg_mode: str, pg_at: float, broker_at: float | None, broker_down: float
    ) -> None:
        super().__init__(name="chaos-outages", daemon=True)
        self.pg, self.pg_mode, self.pg_at = pg, pg_mode, pg_at
        self.broker_at, self.broker_down = broker_at, broker_down
        self.begin = threading.Event()
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.begin.wait()
            started = time.monotonic()
            plan: list[tuple[float, Callable[[], None]]] = [(self.pg_at, self._restart_pg)]
            if self.broker_at is not None:
                plan.append((self.broker_at, self._restart_broker))
            for offset, act in sorted(plan, key=lambda p: p[0]):
                if self.stop.wait(max(0.0, started + offset - time.monotonic())):
                    return
                act()
        except BaseException as exc:
            self.error = exc

    def _restart_pg(self) -> None:
        fault = Fault(f"postgresql restart ({self.pg_mode})", "postgresql", "server", time.time())
        self.faults.append(fault)
        self.pg.restart(self.pg_mode)
        fault.until = time.time()

    def _restart_broker(self) -> None:
        fault = Fault("rabbitmq restart", "rabbitmq", "server", time.time())
        self.faults.append(fault)
        try:
            mq.rabbitmqctl("stop_app", timeout=120)
            self.stop.wait(self.broker_down)
        finally:
            mq.start_broker()
            fault.until = time.time()


@dataclass
class Sample:
    at: float
    statuses: dict[str, int]
    outbox: int | None


class Monitor(threading.Thread):
    """Samples execution counts by status (and the outbox depth) twice a second."""

    def __init__(self, url: str, rabbitmq: bool) -> None:
        super().__init__(name="chaos-monitor", daemon=True)
        self.url = url
        self.rabbitmq = rabbitmq
        self.samples: list[Sample] = []
        self.stop = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[dict[str, Any]] | None = None
        while not self.stop.wait(0.5):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.url)
                rows = conn.execute("SELECT status, count(*) AS n FROM execution GROUP BY status").fetchall()
                outbox = None
                if self.rabbitmq:
                    row = conn.execute("SELECT count(*) AS n FROM outbox").fetchone()
                    outbox = int(row["n"]) if row else None
                self.samples.append(Sample(time.time(), {r["status"]: int(r["n"]) for r in rows}, outbox))
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
