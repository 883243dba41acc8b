"""Acceptance: how an executor tells a dead worker from a live one whose liveness session
alone dropped (migration 0022), with real processes against a real PostgreSQL.

A process that dies loses every session at once; a liveness session dropped by
pg_terminate_backend or a proxy leaves the process's other sessions connected. Here the
lock grace and the heartbeat bound are both 30 s and the periodic sweep is off, so only
the watch (recovery.watch_interval) starts a sweep, and only "lock gone and no session of
the process left" can declare a worker dead within the tests' deadlines. Every wait polls
the database with a deadline; the assertions are about what the database records."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, until
from acceptance.recovery_kit import (
    RECOVERY_SETTINGS,
    TERMINAL,
    Conn,
    attempts,
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
from support.polling import stays

pytestmark = pytest.mark.acceptance

SLOW_GRACE = {
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": "10",  # stale after 30 s
    "CONVEYOR__WORKER__LOCK_GRACE": "30",
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "3600",  # no periodic sweep: the watch alone
}


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    return conveyor_env(db_url, **{**RECOVERY_SETTINGS, **SLOW_GRACE}, **transport_env)


def test_a_killed_worker_is_judged_dead_by_its_sessions_without_waiting_out_its_grace(
    procs: Procs, env: dict[str, str], db: Conn
) -> None:
    executor = start_executor(procs, env)
    workers = {name: start_worker(procs, env, name) for name in ("wa", "wb")}
    eid = request(db, "core.sleep", {"seconds": 30})
    victim, survivor = running_on(procs, db, eid, workers)
    victim_id = worker_row(db, victim)["id"]

    workers[victim].kill()

    def second_attempt_started() -> dict[str, Any] | None:
        rows = attempts(db, eid)
        return rows[1] if len(rows) == 2 and rows[1]["started"] is not None else None

    # The heartbeat was at most 10 s old at the kill, so it turns stale 20 s after it at
    # the earliest, and the grace is 30 s: within 15 s only the process test can act.
    second = until(procs, second_attempt_started, timeout=15)
    assert second["worker_name"] == survivor
    rows = attempts(db, eid)
    assert summary(rows)[0] == (1, victim, "worker_lost")
    assert rows[0]["ended"] <= rows[1]["started"]  # one copy at a time
    assert worker_row(db, victim)["status"] == "inactive"
    executor.wait_for_log(f"Worker {victim} (ID: {victim_id}) liveness lock released: process gone, no session left")


def test_a_live_worker_whose_liveness_session_alone_dropped_keeps_its_grace(
    procs: Procs, env: dict[str, str], db: Conn, tmp_path: Path
) -> None:
    """The worker is stopped (SIGSTOP) so it cannot take its lock again, and its liveness
    session is terminated: the lock stays gone while the watch asks ten times a second,
    but the process's other sessions are connected, so no executor declares it dead.
    Continued, it takes its lock again and finishes the execution, once."""
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    start_executor(procs, env)
    workers = {n: start_worker(procs, env, n) for n in ("wa", "wb")}
    eid = request(db, "core.local", {"cmd": tick_command(ticks, 60)})
    victim, _ = running_on(procs, db, eid, workers)
    victim_id = worker_row(db, victim)["id"]
    until(procs, lambda: any(ticks.iterdir()))

    workers[victim].signal(signal.SIGSTOP)
    try:
        terminate_liveness_session(db, victim_id)
        # An executor saw the lock gone (not a vacuous test) ...
        until(procs, lambda: worker_row(db, victim)["lock_lost_at"] is not None, timeout=10)
        # ... and the process's other sessions are what keeps it alive.
        tag = worker_row(db, victim)["session_tag"]
        others = db.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
            " AND strpos(application_name, %s) > 0",
            (f"[{tag}]",),
        ).fetchone()
        assert others is not None
        assert others["n"] >= 1
        stays(
            lambda: worker_row(db, victim)["status"] == "active" and len(attempts(db, eid)) == 1,
            duration=2.0,
            message="a live worker whose liveness session alone dropped was declared dead",
        )
    finally:
        workers[victim].signal(signal.SIGCONT)
    workers[victim].wait_for_log("liveness session re-established", timeout=15)

    done = until_status(procs, db, eid, TERMINAL)
    assert done["status"] == "completed", done
    assert summary(attempts(db, eid)) == [(1, victim, "completed")]
    assert worker_row(db, victim)["status"] == "active"
    assert len(list(ticks.iterdir())) == 1  # one copy ran
