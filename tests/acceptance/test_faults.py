"""Acceptance: faults a production fleet meets, against real processes.

1. PostgreSQL restarted under load (a private server, so the shared one is never
   touched): nothing submitted is lost or left stuck, nothing completes twice, every
   process reconnects on its own.
3. A worker's claim commits but the answer is lost with the connection: the execution
   still runs, once, instead of staying running on a live worker that does not know it.

(2, a partition, is in test_partition.py.)
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.faults_kit import (
    FAULT_SETTINGS,
    SCHEMA,
    TERMINAL,
    _alive,
    _connect,
    _one,
    _rows,
)
from acceptance.helpers import Procs, conveyor_env, eventually
from acceptance.netns import Forwarder
from acceptance.pg import PrivatePostgres
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    group = Procs(tmp_path / "logs", {})
    try:
        yield group
    finally:
        group.close()


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
