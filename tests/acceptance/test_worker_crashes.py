"""Acceptance: crash recovery with real ``conveyor`` processes and real faults (SIGKILL,
SIGSTOP) against a real PostgreSQL: a worker killed mid-run or holding scheduled work,
restarted under its name, its liveness session killed, no workers left, and an action
that kills its worker every time. Every wait polls the database with a
deadline; the assertions are about what the execution records show."""

from __future__ import annotations

import itertools
import json
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, until
from acceptance.recovery_kit import (
    RECOVERY_SETTINGS,
    TERMINAL,
    Conn,
    attempts,
    execution,
    python_path,
    request,
    running_on,
    start_executor,
    start_worker,
    summary,
    terminate_liveness_session,
    tick_command,
    until_status,
    worker_row,
)
from conveyor.sdk import request_executions
from support.polling import GiveUp

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    """Every scenario runs on both transports: the same executor and worker code."""
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **transport_env)


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
    eid = request(db, "core.local", {"cmd": tick_command(ticks, 40)})
    victim, _ = running_on(procs, db, eid, workers)
    until(procs, lambda: any(ticks.iterdir()))
    terminate_liveness_session(db, worker_row(db, victim)["id"])
    workers[victim].wait_for_log("liveness session re-established", timeout=15)

    done = until_status(procs, db, eid, TERMINAL)
    assert done["status"] == "completed"
    assert summary(attempts(db, eid)) == [(1, victim, "completed")]
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
