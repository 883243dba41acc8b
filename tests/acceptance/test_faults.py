"""Acceptance: faults a production fleet meets, against real processes.

1. PostgreSQL restarted under load (a private server, so the shared one is never
   touched): nothing submitted is lost or left stuck, nothing completes twice, every
   process reconnects on its own.
2. A partition: a worker in its own network namespace loses its link to PostgreSQL
   while it runs work; that work is recovered after about the staleness threshold and
   runs on another worker, the cut-off worker stops its copy before the new one starts,
   its late result is refused, and it rejoins when the link is back.
3. A worker's claim commits but the answer is lost with the connection: the execution
   still runs, once, instead of staying running on a live worker that does not know it.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from acceptance.helpers import Proc, Procs, conveyor_env, eventually
from acceptance.netns import Forwarder, VethNamespace, liveness_keepalive, netns_problem
from acceptance.pg import PrivatePostgres
from conveyor.sdk import Client, request_execution

pytestmark = pytest.mark.acceptance

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SCHEMA = "conveyor"
TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}
# Heartbeat 1 s (FAST_SETTINGS), so the staleness threshold is 3 s; quick sweeps; an
# executor's claim left in doubt by an outage is handed back after 5 s, not 30.
FAULT_SETTINGS = {
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    "CONVEYOR__EXECUTOR__NO_WORKER_GRACE": "30",
    "CONVEYOR__EXECUTOR__CLAIM_TIMEOUT": "5",
}
HEARTBEAT, STALENESS = 1.0, 3.0


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    group = Procs(tmp_path / "logs", {})
    try:
        yield group
    finally:
        group.close()


def _connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(
        url, autocommit=True, row_factory=dict_row, connect_timeout=3, options=f"-c search_path={SCHEMA},public"
    )


def _rows(url: str, query: str, params: Mapping[str, Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with _connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _one(url: str, query: str, params: Mapping[str, Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
    rows = _rows(url, query, params)
    assert len(rows) == 1, rows
    return rows[0]


def _alive(procs: Procs) -> bool:
    return all(p.returncode is None for p in procs.started)


# -- 1. PostgreSQL restarted under load ------------------------------------------------------


class Submitter(threading.Thread):
    """Submits ``plan`` one execution per transaction, at a steady pace, retrying through
    an outage. Each request commits together with a token of ours, so a retry after an
    ambiguous commit (sent, then the connection died) cannot submit twice."""

    def __init__(self, url: str, plan: list[tuple[str, dict[str, Any]]], pace: float) -> None:
        super().__init__(name="submitter", daemon=True)
        self.url = url
        self.plan = plan
        self.pace = pace
        self.submitted = 0
        self.retries = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            for i, (ref, params) in enumerate(self.plan):
                deadline = time.monotonic() + 60
                while not self.stop.is_set():
                    try:
                        if conn is None or conn.closed:
                            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                        with conn.transaction():
                            done = conn.execute("SELECT 1 FROM public.submission WHERE token = %s", (i,)).fetchone()
                            if done is None:
                                eid = request_execution(conn, ref, params, schema=SCHEMA)
                                conn.execute("INSERT INTO public.submission VALUES (%s, %s)", (i, eid))
                        break
                    except (psycopg.OperationalError, psycopg.InterfaceError):
                        self.retries += 1
                        if conn is not None:
                            conn.close()
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
                self.submitted = i + 1
                time.sleep(self.pace)
        except BaseException as exc:
            self.error = exc
        finally:
            if conn is not None:
                conn.close()


@pytest.mark.parametrize(
    ("mode", "down_for", "heartbeat"),
    [("fast", 0.0, 3.0), ("fast", 5.0, 1.0), ("immediate", 0.0, 3.0)],
    ids=["restart", "outage-5s", "crash"],
)
def test_postgres_restart_under_load(
    private_pg: PrivatePostgres, procs: Procs, mode: str, down_for: float, heartbeat: float
) -> None:
    """``pg_ctl restart -m fast``: a blip, well within self_fence_after (6 s with a 3 s
    heartbeat), so no work may be stopped. Stopped for 5 s with a 1 s heartbeat: longer
    than the staleness threshold (3 s), so workers fence themselves and their work runs
    again. A crash (``-m immediate``: no shutdown checkpoint, crash recovery at start,
    commits made without waiting for the WAL flush may be gone)."""
    url = private_pg.url
    env = conveyor_env(url, **FAULT_SETTINGS, CONVEYOR__WORKER__HEARTBEAT_INTERVAL=heartbeat)
    with _connect(url) as conn:
        conn.execute("CREATE TABLE public.submission (token int PRIMARY KEY, execution bigint NOT NULL)")
        epoch = conn.execute("SELECT pg_postmaster_start_time() AS t").fetchone()["t"]  # type: ignore[index]

    def logs() -> str:
        return procs.logs() + "\n" + private_pg.logs()

    executor = procs.start("executor", name="executor", env=env)
    workers = [procs.start("worker", "--name", n, name=n, env=env) for n in ("w1", "w2")]
    executor.wait_for_log("executor started")
    for w in workers:
        w.wait_for_log("worker registered")

    # 200 core.noop with a core.sleep seconds=1 every 20th, about 25 a second; and two
    # core.sleep seconds=4 just before the restart (which comes after 80), running through it.
    plan: list[tuple[str, dict[str, Any]]] = []
    for i in range(200):
        plan.append(("core.noop", {}))
        if i % 20 == 10:
            plan.append(("core.sleep", {"seconds": 1}))
        if i in (70, 71):
            plan.append(("core.sleep", {"seconds": 4}))
    submitter = Submitter(url, plan, pace=0.04)
    submitter.start()
    try:
        eventually(lambda: submitter.submitted >= 80 or submitter.error, timeout=30, message=logs)
        assert submitter.error is None, submitter.error
        if mode == "fast" and not down_for:
            private_pg.restart()
        else:
            private_pg.stop(mode)
            time.sleep(down_for)
            private_pg.start()
        submitter.join(timeout=120)
    finally:
        submitter.stop.set()
        submitter.join(timeout=10)
    assert submitter.error is None, f"{submitter.error!r}\n{logs()}"
    assert submitter.submitted == len(plan)
    assert submitter.retries >= 1, "the restart never reached the submitter: it did not happen mid-stream"
    restarted = _one(url, "SELECT pg_postmaster_start_time() AS t")["t"]
    assert restarted > epoch

    expected = {r["execution"] for r in _rows(url, "SELECT execution FROM public.submission")}
    assert len(expected) == len(plan)

    def all_completed() -> bool:
        rows = _rows(url, "SELECT id, status FROM execution")
        return {r["id"] for r in rows} == expected and all(r["status"] == "completed" for r in rows)

    def summary() -> str:
        counts = _rows(url, "SELECT status, count(*) AS n FROM execution GROUP BY status")
        stuck = _rows(url, "SELECT id, action_ref, status, attempt, worker FROM execution "
                           "WHERE status <> 'completed' ORDER BY id LIMIT 20")  # fmt: skip
        return f"by status: {counts}\nnot completed: {stuck}\n{logs()}"

    # None lost (every submitted one is there, nothing else is), none stuck.
    eventually(all_completed, timeout=60, interval=0.25, message=summary)

    twice = _rows(url, "SELECT execution, count(*) AS n FROM execution_attempt WHERE outcome = 'completed' "
                       "GROUP BY execution HAVING count(*) <> 1")  # fmt: skip
    assert twice == [], f"executions with more than one completed attempt: {twice}"
    assert len(_rows(url, "SELECT DISTINCT execution FROM execution_attempt WHERE outcome = 'completed'")) == len(
        expected
    )
    outcomes = _rows(url, "SELECT outcome, count(*) AS n FROM execution_attempt GROUP BY outcome ORDER BY outcome")
    print(f"{len(expected)} executions ({submitter.retries} submissions retried); attempts by outcome: {outcomes}")
    unclosed = _rows(url, "SELECT execution, attempt, worker_name FROM execution_attempt WHERE outcome IS NULL")
    assert unclosed == [], f"attempts never closed: {unclosed}"

    # Every process reconnected on its own, and the workers are active again.
    assert _alive(procs), logs()

    def workers_active() -> bool:
        rows = _rows(
            url,
            "SELECT name, status, now() - last_heartbeat < make_interval(secs => %s) AS fresh FROM worker",
            (heartbeat + 2,),
        )
        return sorted((r["name"], r["status"], r["fresh"]) for r in rows) == [
            ("w1", "active", True),
            ("w2", "active", True),
        ]

    eventually(workers_active, timeout=20, interval=0.2, message=logs)
    if down_for > 2 * heartbeat:
        # Unreachable longer than self_fence_after: each worker stopped its work on its own.
        for w in workers:
            assert "worker lost its standing" in w.stderr(), w.logs()
            assert "worker rejoined" in w.stderr(), w.logs()
    if mode == "fast" and not down_for:
        # A restart is not a lost worker: what ran through it carried on.
        for w in workers:
            assert "worker lost its standing" not in w.stderr(), w.logs()
        assert [o for o in outcomes if o["outcome"] != "completed"] == [], outcomes
    assert _alive(procs), logs()
    for p in procs.started:
        assert "Traceback" not in p.stderr(), p.logs()


# -- 2. a partition ---------------------------------------------------------------------------


@pytest.fixture
def veth() -> Iterator[VethNamespace]:
    problem = netns_problem()
    if problem:
        if IN_CI:
            pytest.fail(f"{problem} (CI=true: the partition test must run)")
        pytest.skip(problem)
    with VethNamespace() as ns:
        yield ns


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z) \[[a-z ]+\] (.*)$")


def _ticks(path: Path) -> tuple[float, float]:
    """First and last timestamp a copy of the ticker wrote."""
    stamps = [float(line) for line in path.read_text().split("\n")[:-1]]  # complete lines only
    return (stamps[0], stamps[-1]) if stamps else (math.inf, math.inf)


def _log_times(proc: Proc, text: str, execution_id: int) -> list[datetime]:
    """When ``proc`` logged ``text`` about ``execution_id`` (its log's own UTC timestamps)."""
    found = []
    for line in proc.stderr().splitlines():
        m = _LOG_LINE.match(line)
        if m and text in m.group(2) and re.search(rf"\bexecution_id={execution_id}\b", m.group(2)):
            found.append(datetime.fromisoformat(m.group(1).replace("Z", "+00:00")))
    return found


def test_partitioned_worker_is_fenced_and_replaced(
    veth: VethNamespace, private_pg: PrivatePostgres, procs: Procs, tmp_path: Path
) -> None:
    # A private server: the shared one may see other suites terminate sessions, which
    # would mix a dropped session into what must be a partition.
    db_url = private_pg.url
    env = conveyor_env(db_url, **FAULT_SETTINGS)
    forwarder = Forwarder(veth.host_addr, ("127.0.0.1", private_pg.port), liveness_keepalive(HEARTBEAT)).start()
    try:
        _partition_scenario(veth, forwarder, db_url, env, procs, tmp_path)
    except BaseException:
        print("=== forwarder: connections ended\n" + "\n".join(forwarder.events))
        raise
    finally:
        procs.close()  # before the forwarder and the namespace go
        procs.started.clear()
        forwarder.close()


def _partition_scenario(
    veth: VethNamespace, forwarder: Forwarder, db_url: str, env: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    ns_url = psycopg.conninfo.make_conninfo(db_url, host=forwarder.host, port=str(forwarder.port))
    short_s, long_s, ticker_s = 5.0, 12.0, 10
    # A subprocess action that appends a timestamp to a file of its own (per shell pid)
    # every 50 ms for ticker_s seconds: shows when each copy really ran.
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    ticker = (
        f"end=$(( $(date +%s) + {ticker_s} )); "
        f'while [ "$(date +%s)" -lt "$end" ]; do date +%s.%N >> {ticks}/$$; sleep 0.05; done'
    )

    def logs() -> str:  # printed at teardown as well, with the forwarder's events
        return procs.logs()

    executor = procs.start("executor", name="executor", env=env)
    cut_off = Proc(["worker", "--name", "w-ns"], {**env, "DATABASE_URL": ns_url}, tmp_path / "logs", "w-ns",
                   prefix=veth.command())  # fmt: skip
    procs.started.append(cut_off)
    other = procs.start("worker", "--name", "w-root", name="w-root", env=env)
    executor.wait_for_log("executor started")
    cut_off.wait_for_log("worker registered")
    other.wait_for_log("worker registered")

    # The other worker is cordoned until every execution runs on the cut-off one.
    with Client(db_url, SCHEMA) as client:
        client.cordon("w-root")
    with _connect(db_url) as conn:
        long_id = request_execution(conn, "core.sleep", {"seconds": long_s}, schema=SCHEMA)
        short_id = request_execution(conn, "core.sleep", {"seconds": short_s}, schema=SCHEMA)
        ticker_id = request_execution(conn, "core.local", {"cmd": ticker}, schema=SCHEMA)
    ids = (long_id, short_id, ticker_id)

    def running_on_ns() -> list[dict[str, Any]] | None:
        rows = _rows(
            db_url,
            "SELECT e.id, e.status, e.started, w.name FROM execution e LEFT JOIN worker w ON w.id = e.worker "
            "WHERE e.id = ANY(%s)",
            (list(ids),),
        )
        return rows if all(r["status"] == "running" and r["name"] == "w-ns" for r in rows) else None

    started = {r["id"]: r["started"] for r in eventually(running_on_ns, timeout=20, interval=0.1, message=logs)}

    with Client(db_url, SCHEMA) as client:
        client.cordon("w-root", cordoned=False)

    # Cut so that the short execution ends just after the cut (its result is then late)
    # and the long one is still running when the worker fences itself.
    cut_at = started[short_id].timestamp() + short_s - 0.5
    wait = _one(db_url, "SELECT %s - extract(epoch FROM clock_timestamp())::float8 AS s", (cut_at,))["s"]
    assert wait > 0.2, f"too slow to cut in time ({wait:.2f}s left)"
    time.sleep(wait)
    veth.cut()
    cut = _one(db_url, "SELECT clock_timestamp() AS t")["t"]
    print(f"executions started at {started}, link cut at {cut.isoformat()} (database clock)")

    def recovered() -> dict[int, dict[str, Any]] | None:
        rows = _rows(
            db_url,
            "SELECT execution, attempt, worker_name, started FROM execution_attempt "
            "WHERE execution = ANY(%s) AND attempt = 2 AND started IS NOT NULL",
            (list(ids),),
        )
        return {r["execution"]: r for r in rows} if len(rows) == len(ids) else None

    second = eventually(recovered, timeout=STALENESS + 10, interval=0.05, message=logs)
    seen_at = _one(db_url, "SELECT clock_timestamp() AS t")["t"]
    ns_status = _one(db_url, "SELECT status FROM worker WHERE name = 'w-ns'")["status"]
    veth.restore()

    # Recovered after about the threshold (3 s after the last heartbeat, which was at
    # most one interval before the cut), never before the worker could fence itself.
    for eid, row in second.items():
        assert row["worker_name"] == "w-root", row
        delay = (row["started"] - cut).total_seconds()
        assert STALENESS - HEARTBEAT - 0.5 <= delay <= STALENESS + 3.0, (
            f"execution {eid} recovered {delay:.2f}s after the cut"
        )
    assert ns_status == "inactive", f"{ns_status} at {seen_at}"

    # The cut-off worker stopped its copies of the long ones before the new copies started.
    cut_off.wait_for_log("stopped executions", timeout=10)
    for eid in (long_id, ticker_id):
        stopped = _log_times(cut_off, "execution stopped on this worker", eid)
        assert len(stopped) == 1, f"execution {eid}: {stopped}"
        assert stopped[0] < second[eid]["started"], f"execution {eid}: stopped {stopped[0]}, restarted {second[eid]}"
    assert _log_times(cut_off, "execution stopped on this worker", short_id) == []

    # The ticker's first copy (its process group killed) never ran beside the second.
    def two_copies() -> list[tuple[float, float]] | None:
        copies = sorted(_ticks(f) for f in ticks.iterdir())
        return copies if len(copies) == 2 and all(math.isfinite(c[0]) for c in copies) else None

    first, again = eventually(two_copies, timeout=10, interval=0.1, message=logs)
    assert first[1] < again[0], f"the two copies of the subprocess overlapped: {first}, {again}"
    assert first[1] < second[ticker_id]["started"].timestamp(), f"old copy still ticking: {first}, {second}"

    # Link back: the short one's late result is refused, and the worker rejoins.
    eventually(lambda: _log_times(cut_off, "late result refused", short_id), timeout=30, interval=0.2, message=logs)
    cut_off.wait_for_log("worker rejoined", timeout=30)

    def rejoined() -> bool:
        row = _one(db_url, "SELECT status, now() - last_heartbeat < interval '3 seconds' AS fresh FROM worker "
                           "WHERE name = 'w-ns'")  # fmt: skip
        return row["status"] == "active" and row["fresh"]

    eventually(rejoined, timeout=20, interval=0.2, message=logs)

    # All finish on the other worker: exactly one winning attempt each.
    def finished() -> bool:
        rows = _rows(db_url, "SELECT status FROM execution WHERE id = ANY(%s)", (list(ids),))
        return all(r["status"] in TERMINAL for r in rows)

    eventually(finished, timeout=long_s + 15, interval=0.2, message=logs)
    assert len(list(ticks.iterdir())) == 2, "the subprocess ran more than twice"
    for eid in ids:
        execution = _one(db_url, "SELECT e.status, w.name FROM execution e JOIN worker w ON w.id = e.worker "
                                 "WHERE e.id = %s", (eid,))  # fmt: skip
        assert (execution["status"], execution["name"]) == ("completed", "w-root"), (eid, execution)
        attempts = _rows(
            db_url, "SELECT attempt, worker_name, outcome FROM execution_attempt WHERE execution = %s ORDER BY attempt",
            (eid,),
        )  # fmt: skip
        assert [(a["attempt"], a["worker_name"], a["outcome"]) for a in attempts] == [
            (1, "w-ns", "worker_lost"),
            (2, "w-root", "completed"),
        ], (eid, attempts, logs())

    assert _alive(procs), logs()
    assert _one(db_url, "SELECT status FROM worker WHERE name = 'w-ns'")["status"] == "active"
    for p in procs.started:
        assert "Traceback" not in p.stderr(), p.logs()


# -- 3. a claim whose commit is not answered ---------------------------------------------------


def test_claim_committed_but_answer_lost(private_pg: PrivatePostgres, procs: Procs, tmp_path: Path) -> None:
    """The worker's claim (scheduled -> running) commits, but its connection dies before
    the answer arrives. The execution must not stay running on a live worker that does
    not know it has it: it runs, once."""
    runs = tmp_path / "runs"
    marker = f"answer-lost-{uuid.uuid4().hex}"
    fault = {"claim_seen_on": "", "fired": ""}
    guard = threading.Lock()

    def inspect(peer: str, side: str, data: bytes) -> float | None:
        with guard:
            if fault["fired"]:
                return None
            if side == "server" and marker.encode() in data:
                fault["claim_seen_on"] = peer  # the claimed row came back on this connection
            elif side == "client" and peer == fault["claim_seen_on"] and b"COMMIT" in data:
                fault["fired"] = peer
                return 0.5  # the server commits; its answer never reaches the worker
        return None

    forwarder = Forwarder("127.0.0.1", ("127.0.0.1", private_pg.port), inspect=inspect).start()
    try:
        env = conveyor_env(private_pg.url, **FAULT_SETTINGS)
        via = psycopg.conninfo.make_conninfo(private_pg.url, host=forwarder.host, port=str(forwarder.port))
        procs.start("executor", name="executor", env=env).wait_for_log("executor started")
        worker = procs.start("worker", "--name", "w1", name="w1", env={**env, "DATABASE_URL": via})
        worker.wait_for_log("worker registered")
        with _connect(private_pg.url) as conn:
            eid = request_execution(conn, "core.local", {"cmd": f"echo {marker} >> {runs}"}, schema=SCHEMA)

        def terminal() -> dict[str, Any] | None:
            row = _one(private_pg.url, "SELECT status FROM execution WHERE id = %s", (eid,))
            return row if row["status"] in TERMINAL else None

        eventually(
            terminal, timeout=20, interval=0.1, message=lambda: procs.logs() + "\n" + "\n".join(forwarder.events)
        )
        assert fault["fired"], "the claim's commit was never intercepted: nothing was tested"
        attempts = _rows(
            private_pg.url,
            "SELECT attempt, worker_name, outcome FROM execution_attempt WHERE execution = %s ORDER BY attempt",
            (eid,),
        )
        assert _one(private_pg.url, "SELECT status FROM execution WHERE id = %s", (eid,))["status"] == "completed"
        assert [a["outcome"] for a in attempts].count("completed") == 1, attempts
        assert runs.read_text().split() == [marker], "the command did not run exactly once"
        assert worker.returncode is None, worker.logs()
    finally:
        procs.close()
        procs.started.clear()
        forwarder.close()
