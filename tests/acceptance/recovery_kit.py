"""Shared by the crash-recovery acceptance modules: real ``conveyor`` executors and
workers with short liveness intervals, and reading what the execution records show."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from acceptance.helpers import Proc, Procs, until
from conveyor.domain.status import TERMINAL as TERMINAL
from conveyor.sdk import request_execution
from conveyor.store.queries import Q

Conn = psycopg.Connection[dict[str, Any]]

NOT_PICKED_UP = "Execution timeout: worker did not pick up task within timeout"

# Staleness is 3 s (heartbeat 1 s x 3); sweeps and polls are frequent.
RECOVERY_SETTINGS = {
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": "1",
    "CONVEYOR__EXECUTOR__POLL_INTERVAL": "0.2",
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
}


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


def running_on(procs: Procs, db: Conn, eid: int, workers: dict[str, Proc]) -> tuple[str, str]:
    running = until_status(procs, db, eid, {"running"})
    victim = running["worker_name"]
    [other] = set(workers) - {victim}
    return victim, other


def tick_command(ticks: Path, count: int) -> str:
    """A core.local command that appends a timestamp ``count`` times, 50 ms apart, to a
    file of its own in ``ticks`` (named by its shell's pid): as many files as copies ran."""
    return f"for i in $(seq {count}); do date +%s.%N >> {ticks}/$$; sleep 0.05; done"


def terminate_liveness_session(db: Conn, worker_id: int) -> None:
    """End the worker's liveness session alone (the one holding its advisory lock), as an
    operator's pg_terminate_backend or a proxy reset would; its other sessions stay."""
    terminated = db.execute(
        "SELECT pg_terminate_backend(l.pid) AS ok FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        " AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND l.classid = worker_lock_class()::oid AND l.objid = %s::oid",
        (worker_id,),
    ).fetchall()
    assert [r["ok"] for r in terminated] == [True]
