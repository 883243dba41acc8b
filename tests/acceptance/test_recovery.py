"""Acceptance: crash recovery with real ``conveyor`` processes and real faults (SIGKILL,
SIGSTOP, SIGTERM), against a real PostgreSQL. Every wait polls the database with a
deadline; the assertions are about what the execution records show."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Proc, Procs, conveyor_env, describe, until
from conveyor.sdk import request_execution, request_executions
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from support.polling import GiveUp

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]

NOT_PICKED_UP = "Execution timeout: worker did not pick up task within timeout"
TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}

# Staleness is 3 s (heartbeat 1 s x 3); sweeps and polls are frequent.
RECOVERY_SETTINGS = {
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": "1",
    "CONVEYOR__EXECUTOR__POLL_INTERVAL": "0.2",
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
}


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    """Every scenario runs on both transports: the same executor and worker code."""
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **transport_env)


# -- helpers ------------------------------------------------------------------------------


def start_executor(procs: Procs, env: dict[str, str], **overrides: object) -> Proc:
    proc = procs.start("executor", name="executor", env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("executor started")
    return proc


def start_worker(
    procs: Procs, env: dict[str, str], name: str, *args: str, label: str | None = None, **overrides: object
) -> Proc:
    worker_env = {**env, **{k: str(v) for k, v in overrides.items()}}
    proc = procs.start("worker", "--name", name, *args, name=label or f"worker-{name}", env=worker_env)
    proc.wait_for_log("worker registered")
    return proc


def execution(db: Conn, eid: int) -> dict[str, Any]:
    found = db.execute(Q["get_execution"], {"id": eid}).fetchone()
    assert found is not None
    return dict(found)


def attempts(db: Conn, eid: int) -> list[dict[str, Any]]:
    return list(db.execute(Q["get_attempts"], {"id": eid}).fetchall())


def worker_row(db: Conn, name: str) -> dict[str, Any]:
    found = db.execute("SELECT * FROM worker WHERE name = %s", (name,)).fetchone()
    assert found is not None
    return dict(found)


def until_status(procs: Procs, db: Conn, eid: int, statuses: set[str], timeout: float = 20.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        e = execution(db, eid)
        return e if e["status"] in statuses else None

    return until(procs, check, timeout)  # type: ignore[no-any-return]


def request(db: Conn, ref: str, parameters: dict[str, Any] | None = None) -> int:
    return request_execution(db, ref, parameters or {})


def summary(rows: list[dict[str, Any]]) -> list[tuple[int, str, str | None]]:
    return [(a["attempt"], a["worker_name"], a["outcome"]) for a in rows]


def python_path(env: dict[str, str], folder: Path) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))}


# -- a. SIGKILL of a worker running an execution ---------------------------------------------


def test_sigkill_mid_run_reruns_elsewhere_via_the_lock(procs: Procs, env: dict[str, str], db: Conn) -> None:
    executor = start_executor(procs, env)
    workers = {name: start_worker(procs, env, name) for name in ("wa", "wb")}

    eid = request(db, "core.sleep", {"seconds": 5})
    running = until_status(procs, db, eid, {"running"})
    victim = running["worker_name"]
    [survivor] = set(workers) - {victim}
    first_started = attempts(db, eid)[0]["started"]

    killed_at = datetime.now(UTC)
    workers[victim].kill()
    assert workers[victim].returncode == -signal.SIGKILL

    def second_attempt_started() -> dict[str, Any] | None:
        rows = attempts(db, eid)
        return rows[1] if len(rows) == 2 and rows[1]["started"] is not None else None

    second = until(procs, second_attempt_started, timeout=15)
    # The lock fast path: well before the 3 s staleness bound (the last heartbeat was at
    # most 1 s before the kill, so staleness alone could not act before 2 s).
    assert second["started"] - killed_at < timedelta(seconds=2), (second["started"], killed_at)
    executor.wait_for_log(f"Worker {victim} (ID: {worker_row(db, victim)['id']}) liveness lock released")

    done = until_status(procs, db, eid, TERMINAL, timeout=20)
    assert done["status"] == "completed", done
    assert done["result"]["data"] == 5
    assert (done["worker_name"], done["attempt"]) == (survivor, 2)
    rows = attempts(db, eid)
    assert summary(rows) == [(1, victim, "worker_lost"), (2, survivor, "completed")]
    assert rows[0]["error"] == "worker lost"
    assert rows[0]["started"] == first_started
    # One copy at a time: the first attempt ended (the process was already dead) before
    # the second one started; the intervals do not overlap.
    assert rows[0]["started"] < killed_at < rows[1]["started"]
    assert rows[0]["ended"] <= rows[1]["started"]
    assert rows[0]["ended"] - killed_at > timedelta(seconds=-0.5)
    assert rows[1]["started"] < rows[1]["ended"]
    assert worker_row(db, victim)["status"] == "inactive"

    # The user sees the same story.
    shown = procs.json("executions", "get", str(eid))
    assert [(a["attempt"], a["worker_name"], a["outcome"]) for a in shown["attempts"]] == summary(rows)


# -- b. SIGKILL of a worker holding scheduled work -------------------------------------------


def test_sigkill_with_scheduled_work_hands_it_back_without_an_attempt(
    procs: Procs, env: dict[str, str], db: Conn
) -> None:
    executor = start_executor(procs, env, CONVEYOR__EXECUTOR__NO_WORKER_GRACE=60)
    # A long staleness bound (15 s): only the released lock can declare it dead quickly.
    held = start_worker(procs, env, "w-held", CONVEYOR__WORKER__HEARTBEAT_INTERVAL=5)
    held.signal(signal.SIGSTOP)  # alive for the database (lock held), but claims nothing

    ids = request_executions(db, [("core.echo", {"message": f"m{i}"}) for i in range(3)])

    def all_scheduled_on_held() -> bool:
        return all((e := execution(db, eid))["status"] == "scheduled" and e["worker_name"] == "w-held" for eid in ids)

    until(procs, all_scheduled_on_held, timeout=10)
    assert {execution(db, eid)["attempt"] for eid in ids} == {1}

    killed_at = time.monotonic()
    held.kill()  # a stopped process can still be SIGKILLed

    def all_handed_back() -> bool:
        return all(
            (e := execution(db, eid))["status"] == "requested" and e["attempt"] == 0 and not attempts(db, eid)
            for eid in ids
        )

    until(procs, all_handed_back, timeout=10)
    assert time.monotonic() - killed_at < 5, "handed back by the lock fast path, not the 15 s staleness"
    executor.wait_for_log("handed back scheduled execution of a lost worker")

    start_worker(procs, env, "w-other")
    for eid in ids:
        done = until_status(procs, db, eid, TERMINAL)
        assert (done["status"], done["worker_name"], done["attempt"]) == ("completed", "w-other", 1), done
        assert summary(attempts(db, eid)) == [(1, "w-other", "completed")]


def test_worker_restarted_under_its_name_while_no_executor_ran(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """The whole node restarts: the worker comes back under its name (taking its row and
    lock, so it looks alive) before any executor swept its predecessor. The run its
    predecessor lost must still be recovered, not stay ``running`` forever."""
    first_executor = start_executor(procs, env)
    worker = start_worker(procs, env, "w-fixed")
    eid = request(db, "core.sleep", {"seconds": 2})
    until_status(procs, db, eid, {"running"})
    first_executor.signal(signal.SIGTERM)
    assert first_executor.wait(15) == 0, first_executor.logs()
    worker.kill()

    again = start_worker(procs, env, "w-fixed", label="worker-w-fixed-again")
    assert worker_row(db, "w-fixed")["status"] == "active"
    procs.start("executor", name="executor-again").wait_for_log("executor started")

    done = until_status(procs, db, eid, TERMINAL, timeout=20)
    assert (done["status"], done["worker_name"], done["attempt"]) == ("completed", "w-fixed", 2), done
    assert summary(attempts(db, eid)) == [(1, "w-fixed", "worker_lost"), (2, "w-fixed", "completed")]
    again.wait_for_log("executions of a previous process under this worker name left for recovery")


def test_liveness_session_killed_while_the_process_lives_never_runs_twice_at_once(
    procs: Procs, env: dict[str, str], db: Conn, tmp_path: Path
) -> None:
    """Only the liveness session dies (pg_terminate_backend, idle_session_timeout, a proxy
    reset) while the process lives: the worker notices at once, re-takes its lock within
    its lock_grace, and no executor declares it dead -- the execution finishes where it
    runs, once."""
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    start_executor(procs, env)
    workers = {n: start_worker(procs, env, n) for n in ("wa", "wb")}
    eid = request(db, "core.local", {"cmd": f"for i in $(seq 40); do date +%s.%N >> {ticks}/$$; sleep 0.05; done"})
    victim, _ = _running_on(procs, db, eid, workers)
    until(procs, lambda: any(ticks.iterdir()))
    terminated = db.execute(
        "SELECT pg_terminate_backend(l.pid) AS ok FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        " AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND l.classid = worker_lock_class()::oid AND l.objid = %s::oid",
        (worker_row(db, victim)["id"],),
    ).fetchall()
    assert [r["ok"] for r in terminated] == [True]
    workers[victim].wait_for_log("liveness session re-established", timeout=15)

    done = until_status(procs, db, eid, TERMINAL)
    assert done["status"] == "completed"
    assert [(a["attempt"], a["worker_name"], a["outcome"]) for a in attempts(db, eid)] == [(1, victim, "completed")]
    assert worker_row(db, victim)["status"] == "active"
    assert len(list(ticks.iterdir())) == 1  # one copy ran
    assert workers[victim].returncode is None


# -- c. no workers left -----------------------------------------------------------------------


def test_all_workers_stopped_means_no_workers_available(procs: Procs, env: dict[str, str], db: Conn) -> None:
    start_executor(procs, env)
    workers = [start_worker(procs, env, name) for name in ("wa", "wb")]
    ran = until_status(procs, db, request(db, "core.echo", {"message": "before"}), TERMINAL)
    assert ran["status"] == "completed"

    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(15) == 0, w.logs()
    assert {worker_row(db, name)["status"] for name in ("wa", "wb")} == {"inactive"}

    waited = procs.run("run", "core.echo", "message=after", "--wait", "--json", timeout=30)
    assert waited.returncode != 0, describe(waited)
    failed = json.loads(waited.stdout)
    assert failed["status"] == "failed"
    assert "no workers available" in failed["result"]["error"]
    assert failed["worker"] is None
    assert failed["attempts"] == []


# -- d. SIGTERM: graceful drain -----------------------------------------------------------------


def test_sigterm_drains_hands_back_scheduled_and_finishes_running(procs: Procs, env: dict[str, str], db: Conn) -> None:
    start_executor(procs, env)
    busy = start_worker(
        procs, env, "w-busy", CONVEYOR__WORKER__MAX_CONCURRENT_TASKS=1, CONVEYOR__WORKER__SHUTDOWN_TIMEOUT=30
    )
    # The row advertises more slots than the process runs at once, so that work is
    # dispatched to it that it cannot start yet: scheduled, held by a live worker.
    db.execute("UPDATE worker SET capacity = 3 WHERE name = 'w-busy'")

    long = request(db, "core.sleep", {"seconds": 6})
    until_status(procs, db, long, {"running"})
    waiting = request_executions(db, [("core.noop", {})] * 2)
    until(procs, lambda: all(execution(db, eid)["status"] == "scheduled" for eid in waiting))
    assert {execution(db, eid)["worker_name"] for eid in waiting} == {"w-busy"}
    start_worker(procs, env, "w-idle")

    busy.signal(signal.SIGTERM)
    until(procs, lambda: worker_row(db, "w-busy")["status"] == "draining", timeout=5)
    busy.wait_for_log("handed back scheduled executions")
    # The handed-back work runs elsewhere, at once: before the running one is done.
    for eid in waiting:
        done = until_status(procs, db, eid, TERMINAL, timeout=10)
        assert (done["status"], done["worker_name"], done["attempt"]) == ("completed", "w-idle", 1), done
        assert summary(attempts(db, eid)) == [(1, "w-idle", "completed")]

    # The running one finishes where it runs; then the worker leaves.
    assert busy.wait(20) == 0, busy.logs()
    finished = execution(db, long)
    assert (finished["status"], finished["worker_name"], finished["attempt"]) == ("completed", "w-busy", 1)
    assert summary(attempts(db, long)) == [(1, "w-busy", "completed")]
    assert worker_row(db, "w-busy")["status"] == "inactive"
    for eid in waiting:
        assert execution(db, eid)["ended"] < finished["ended"]


def _running_on(procs: Procs, db: Conn, eid: int, workers: dict[str, Proc]) -> tuple[str, str]:
    running = until_status(procs, db, eid, {"running"})
    victim = running["worker_name"]
    [other] = set(workers) - {victim}
    return victim, other


def test_sigterm_past_the_shutdown_timeout_releases_the_run(procs: Procs, env: dict[str, str], db: Conn) -> None:
    start_executor(procs, env)
    workers = {n: start_worker(procs, env, n, CONVEYOR__WORKER__SHUTDOWN_TIMEOUT=0.5) for n in ("wa", "wb")}
    eid = request(db, "core.sleep", {"seconds": 5})
    victim, other = _running_on(procs, db, eid, workers)

    signalled = time.monotonic()
    workers[victim].signal(signal.SIGTERM)
    assert workers[victim].wait(10) == 0, workers[victim].logs()
    assert time.monotonic() - signalled < 3, "stopped after the 0.5 s shutdown timeout, not after the action"
    assert worker_row(db, victim)["status"] == "inactive"

    done = until_status(procs, db, eid, TERMINAL, timeout=20)
    assert (done["status"], done["worker_name"]) == ("completed", other), done
    rows = attempts(db, eid)
    assert summary(rows) == [(1, victim, "interrupted"), (2, other, "completed")]
    assert rows[0]["error"] == "worker shut down"
    assert rows[0]["ended"] <= rows[1]["started"]


def test_second_sigterm_exits_fast_and_releases_the_run(procs: Procs, env: dict[str, str], db: Conn) -> None:
    start_executor(procs, env)
    workers = {n: start_worker(procs, env, n, CONVEYOR__WORKER__SHUTDOWN_TIMEOUT=60) for n in ("wa", "wb")}
    eid = request(db, "core.sleep", {"seconds": 60})
    victim, other = _running_on(procs, db, eid, workers)

    workers[victim].signal(signal.SIGTERM)
    workers[victim].wait_for_log("waiting for running executions")
    assert workers[victim].returncode is None
    signalled = time.monotonic()
    workers[victim].signal(signal.SIGTERM)
    assert workers[victim].wait(10) == 0, workers[victim].logs()
    assert time.monotonic() - signalled < 2.5
    assert worker_row(db, victim)["status"] == "inactive"

    def rerun_started() -> list[dict[str, Any]] | None:
        rows = attempts(db, eid)
        return rows if len(rows) == 2 and rows[1]["started"] is not None else None

    rows = until(procs, rerun_started, timeout=10)
    assert summary(rows) == [(1, victim, "interrupted"), (2, other, None)]
    assert execution(db, eid)["status"] == "running"


# -- e. an action that kills its worker every time ------------------------------------------


def test_an_action_that_kills_its_worker_is_abandoned_at_the_bound(
    procs: Procs, env: dict[str, str], db: Conn, tmp_path: Path
) -> None:
    (tmp_path / "killer.py").write_text(
        "import os\nimport signal\n\nfrom conveyor import action\n\n\n"
        "@action('test.kill_worker')\n"
        "def kill_worker() -> None:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = python_path({**env, "CONVEYOR__RECOVERY__BACKOFF_BASE": "1"}, tmp_path)
    start_executor(procs, env)
    # Three workers, so that a live one is always there to run the execution again: the
    # gaps between attempts are recovery's doing, not a restart's.
    names = ("wa", "wb", "wc")
    live = {n: start_worker(procs, env, n, "--import", "killer", label=f"{n}-0") for n in names}
    restarts = {n: 0 for n in names}
    deaths: list[int | None] = []

    eid = request(db, "test.kill_worker")

    def supervised_to_the_end() -> bool:
        """The supervisor: restart any worker that died (same name, as a supervisor would), bounded."""
        if execution(db, eid)["status"] in TERMINAL:
            return True
        for n, proc in live.items():
            if proc.returncode is not None:
                deaths.append(proc.returncode)
                restarts[n] += 1
                if restarts[n] > 3:
                    raise GiveUp(f"{n} restarted more than 3 times\n{procs.logs()}")
                live[n] = procs.start("worker", "--name", n, "--import", "killer", name=f"{n}-{restarts[n]}", env=env)
        return False

    until(procs, supervised_to_the_end, timeout=40)

    done = execution(db, eid)
    assert done["status"] == "abandoned", done
    assert done["result"]["error"] == "worker lost"
    rows = attempts(db, eid)
    assert [(a["attempt"], a["outcome"], a["error"]) for a in rows] == [
        (n, "worker_lost", "worker lost") for n in (1, 2, 3)
    ]
    # Each attempt killed the worker that ran it.
    until(procs, lambda: sum(1 for p in procs.started if p.returncode == -signal.SIGKILL) >= 3, timeout=5)
    assert set(deaths) <= {-signal.SIGKILL}
    # The first re-run is immediate; the second waits a backoff of base x [0.5, 1] = >= 0.5 s.
    assert rows[1]["started"] - rows[0]["ended"] < timedelta(seconds=3)
    assert rows[2]["started"] - rows[1]["ended"] >= timedelta(seconds=0.49), rows
    for earlier, later in itertools.pairwise(rows):
        assert earlier["ended"] <= later["started"]


# -- f. the seeds' timeout scenarios ------------------------------------------------------------


@pytest.fixture
def ghost_worker(db_url: str) -> Iterator[tuple[int, Callable[[], None]]]:
    """A worker row that looks alive -- its liveness lock held, its heartbeat kept fresh --
    but never claims anything. Yields (id, start_heartbeats)."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    with connect_sync(db_url, "conveyor", autocommit=True) as holder:
        worker_id = int(
            holder.execute(
                "INSERT INTO worker (name, status, runtimes, actions, capacity, last_heartbeat, stale_after,"
                " lock_epoch) VALUES ('w-ghost', 'active', '{}', '{core.noop}', 10, now(), 3,"
                " pg_postmaster_start_time()) RETURNING id"
            ).fetchone()["id"]
        )
        assert holder.execute("SELECT acquire_worker_lock(%s) AS ok", (worker_id,)).fetchone()["ok"] is True

        def heartbeat() -> None:
            with connect_sync(db_url, "conveyor", autocommit=True) as conn:
                while not stop.wait(0.3):
                    conn.execute("UPDATE worker SET last_heartbeat = now() WHERE id = %s", (worker_id,))

        def start() -> None:
            thread = threading.Thread(target=heartbeat, name="ghost-heartbeat", daemon=True)
            thread.start()
            threads.append(thread)

        try:
            yield worker_id, start
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)


def test_worker_never_picks_up_fails_with_the_seeds_message(
    procs: Procs, env: dict[str, str], db: Conn, ghost_worker: tuple[int, Callable[[], None]]
) -> None:
    ghost, start_heartbeats = ghost_worker
    start_heartbeats()
    executor = start_executor(
        procs,
        env,
        CONVEYOR__EXECUTOR__SCHEDULED_TIMEOUT=1,
        CONVEYOR__EXECUTOR__TIMEOUT_CHECK_INTERVAL=0.5,
        CONVEYOR__EXECUTOR__SCHEDULED_TIMEOUT_RESCHEDULES=0,
    )
    eid = request(db, "core.noop")
    until(procs, lambda: execution(db, eid)["worker"] == ghost, timeout=10)

    done = until_status(procs, db, eid, TERMINAL, timeout=15)
    assert done["status"] == "failed", done
    assert done["result"]["error"] == NOT_PICKED_UP
    assert done["result"]["failed_by"] == "execution_timeout_monitor"
    assert summary(attempts(db, eid)) == [(1, "w-ghost", "not_picked_up")]
    # It was the schedule-to-start monitor, not the dead-worker sweep: the worker is alive.
    assert worker_row(db, "w-ghost")["status"] == "active"
    executor.wait_for_log(f"Execution {eid} has been scheduled for too long, marking as failed")

    waited = procs.run("executions", "get", str(eid))
    assert waited.returncode == 0, describe(waited)
    assert NOT_PICKED_UP in waited.stdout


def test_worker_stops_mid_execution_of_an_abandon_action(
    procs: Procs, env: dict[str, str], db: Conn, tmp_path: Path
) -> None:
    (tmp_path / "fragile.py").write_text(
        "import asyncio\n\nfrom conveyor import action\n\n\n"
        "@action('test.fragile', on_worker_lost='abandon')\n"
        "async def fragile(seconds: float = 30) -> float:\n"
        "    await asyncio.sleep(seconds)\n"
        "    return seconds\n"
    )
    env = python_path(env, tmp_path)
    start_executor(procs, env)
    workers = {n: start_worker(procs, env, n, "--import", "fragile") for n in ("wa", "wb")}
    eid = request(db, "test.fragile")
    victim, _ = _running_on(procs, db, eid, workers)
    workers[victim].kill()

    done = until_status(procs, db, eid, TERMINAL, timeout=10)
    assert done["status"] == "abandoned", done
    assert done["result"]["error"] == "worker lost"
    assert done["attempt"] == 1
    assert summary(attempts(db, eid)) == [(1, victim, "worker_lost")]


# -- g. duplicate worker names ----------------------------------------------------------------


def test_duplicate_worker_name_is_refused(procs: Procs, env: dict[str, str], db: Conn) -> None:
    first = start_worker(procs, env, "dup")
    second = procs.run("worker", "--name", "dup", timeout=30)
    assert second.returncode == 1, describe(second)
    assert "worker name 'dup' is held by a live worker process" in second.stderr, describe(second)
    assert "--name" in second.stderr
    assert "Traceback" not in second.stderr
    # The live worker is untouched.
    assert first.returncode is None
    row = worker_row(db, "dup")
    assert (row["status"], row["pid"]) == ("active", first.pid)


# -- h. cordon, uncordon, drain -----------------------------------------------------------------


def test_cordon_uncordon_and_drain(procs: Procs, env: dict[str, str], db: Conn) -> None:
    start_executor(procs, env)
    start_worker(procs, env, "wa", CONVEYOR__WORKER__MAX_CONCURRENT_TASKS=1)
    start_worker(procs, env, "wb")
    db.execute("UPDATE worker SET capacity = 5 WHERE name = 'wa'")  # more slots than it runs at once

    def run_batch(n: int) -> set[str]:
        ids = request_executions(db, [("core.noop", {})] * n)
        names = set()
        for eid in ids:
            done = until_status(procs, db, eid, TERMINAL)
            assert done["status"] == "completed", done
            names.add(done["worker_name"])
        return names

    cordoned = procs.run("workers", "cordon", "wa")
    assert cordoned.returncode == 0, describe(cordoned)
    assert "cordoned" in cordoned.stdout
    assert worker_row(db, "wa")["cordoned"] is True
    assert run_batch(6) == {"wb"}

    uncordoned = procs.run("workers", "uncordon", "wa")
    assert uncordoned.returncode == 0, describe(uncordoned)
    assert worker_row(db, "wa")["cordoned"] is False
    assert "wa" in run_batch(6)

    # wa runs a long one and holds two more it cannot start yet (wb cordoned meanwhile).
    assert procs.run("workers", "cordon", "wb").returncode == 0
    long = request(db, "core.sleep", {"seconds": 4})
    assert until_status(procs, db, long, {"running"})["worker_name"] == "wa"
    held = request_executions(db, [("core.noop", {})] * 2)
    until(procs, lambda: all(execution(db, eid)["status"] == "scheduled" for eid in held))
    assert {execution(db, eid)["worker_name"] for eid in held} == {"wa"}
    assert procs.run("workers", "uncordon", "wb").returncode == 0

    drained = procs.run("workers", "drain", "wa")
    assert drained.returncode == 0, describe(drained)
    assert "2 scheduled execution(s) handed to other workers" in drained.stdout
    for eid in held:
        done = until_status(procs, db, eid, TERMINAL, timeout=10)
        assert (done["status"], done["worker_name"], done["attempt"]) == ("completed", "wb", 1), done
    # The drained worker gets nothing new; what it runs carries on there.
    assert run_batch(3) == {"wb"}
    finished = until_status(procs, db, long, TERMINAL)
    assert (finished["status"], finished["worker_name"]) == ("completed", "wa")
    assert summary(attempts(db, long)) == [(1, "wa", "completed")]
    for eid in held:
        assert execution(db, eid)["ended"] < finished["ended"]
    listed = {w["name"]: w for w in procs.json("workers", "list")}
    assert listed["wa"]["cordoned"] is True
    assert listed["wb"]["cordoned"] is False

    unknown = procs.run("workers", "cordon", "nobody")
    assert unknown.returncode == 1, describe(unknown)
    assert "no worker named 'nobody'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


# -- i. health endpoints ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health_endpoints(procs: Procs, env: dict[str, str]) -> None:
    worker_port, executor_port = _free_port(), _free_port()
    health = {"CONVEYOR__HEALTH__HOST": "127.0.0.1"}
    worker = start_worker(procs, {**env, **health}, "w-health", CONVEYOR__HEALTH__PORT=worker_port)
    worker.wait_for_log("health endpoint listening")
    start_executor(procs, {**env, **health}, CONVEYOR__HEALTH__PORT=executor_port)

    base = f"http://127.0.0.1:{worker_port}"
    assert _get(f"{base}/healthz") == (200, {"status": "ok"})
    status, body = until(procs, lambda: (r := _get(f"{base}/readyz"))[0] == 200 and r, timeout=10)
    assert status == 200
    assert body["status"] == "ready"
    assert body["checks"] == {"database": True, "loop": True, "transport": True, "worker": True}
    assert isinstance(body["loop_lag_seconds"], float)
    missing, error = _get(f"{base}/nope")
    assert missing == 404
    assert "/healthz" in error["error"]

    executor_base = f"http://127.0.0.1:{executor_port}"
    until(procs, lambda: _get(f"{executor_base}/healthz")[0] == 200, timeout=10)
    status, body = until(procs, lambda: (r := _get(f"{executor_base}/readyz"))[0] == 200 and r, timeout=10)
    assert body["checks"] == {"database": True, "loop": True, "transport": True, "executor_duties": True}

    with urllib.request.urlopen(f"{executor_base}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        metrics = response.read().decode()
    for name in ("conveyor_dlq_depth", "conveyor_dead_letter_handler_seconds_count", "conveyor_outbox_depth"):
        assert f"\n{name} " in metrics, name

    # The worker serves its own metrics: what it ran, how long it took to start.
    done = procs.run("run", "core.echo", "message=metrics", "--wait")
    assert done.returncode == 0, describe(done)
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        metrics = response.read().decode()
    assert 'conveyor_execution_duration_seconds_count{action="core.echo",outcome="completed"} 1.0' in metrics
    assert "\nconveyor_scheduling_latency_seconds_count 1.0" in metrics
