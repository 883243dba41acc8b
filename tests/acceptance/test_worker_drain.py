"""Acceptance: a worker leaving gracefully with real ``conveyor`` processes against a real
PostgreSQL: SIGTERM drains (hands back scheduled work, finishes or releases running
work), and cordon, uncordon and drain from the CLI. Every wait polls the database with a
deadline; the assertions are about what the execution records show."""

from __future__ import annotations

import signal
import time
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
    request,
    running_on,
    start_executor,
    start_worker,
    summary,
    until_status,
    worker_row,
)
from conveyor.sdk import request_executions

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    """Every scenario runs on both transports: the same executor and worker code."""
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **transport_env)


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


def test_sigterm_past_the_shutdown_timeout_releases_the_run(procs: Procs, env: dict[str, str], db: Conn) -> None:
    start_executor(procs, env)
    workers = {n: start_worker(procs, env, n, CONVEYOR__WORKER__SHUTDOWN_TIMEOUT=0.5) for n in ("wa", "wb")}
    eid = request(db, "core.sleep", {"seconds": 5})
    victim, other = running_on(procs, db, eid, workers)

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
    victim, other = running_on(procs, db, eid, workers)

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


# -- h. cordon, uncordon, drain -----------------------------------------------------------------


def test_cordon_uncordon_and_drain(procs: Procs, env: dict[str, str], db: Conn, tmp_path: Path) -> None:
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
    # It runs until the test opens its gate: a fixed sleep ended first on a busy machine (4 s
    # once, 12 s once, with the four CLI calls below slow), and the slot it freed took the two
    # held ones before the drain.
    gate = tmp_path / "gate"
    long = request(db, "core.local", {"cmd": f"while [ ! -e {gate} ]; do sleep 0.05; done"})
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
    gate.touch()
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
