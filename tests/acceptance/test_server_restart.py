"""Acceptance: PostgreSQL itself goes away and comes back (a private server: the shared
one is never touched), while a worker runs sync Python actions that record every run.

1. A crash-restart shorter than the staleness threshold is not a lost worker:
   ``pg_ctl restart -m immediate`` (a new postmaster); a backend crash (the postmaster
   survives and reinitialises: every session and lock is gone, its start time is not
   renewed), also with a worker that gets back only seconds after the executor; and a
   stop of a second or two during which runs finish (their results wait in the worker
   and are written afterwards). Every execution completes, each action body
   runs exactly once, nothing is ``abandoned``, no attempt ends ``worker_lost``.
2. A worker and an executor started while the server is down wait for it (logging each
   retry) instead of exiting, then register and run work.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from acceptance.helpers import Proc, Procs, conveyor_env, describe, eventually, run_cli, stays
from acceptance.netns import Forwarder
from acceptance.pg import PrivatePostgres
from conveyor.domain.status import TERMINAL
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance

SCHEMA = "conveyor"
# Heartbeat 5 s: the threshold is 15 s and a worker stops its work on its own after 10 s
# without a heartbeat; every outage below is well within that. Quick sweeps, so that an
# executor that wrongly took a missing lock for a dead worker would act at once.
HEARTBEAT = 5.0
SETTINGS = {
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": str(HEARTBEAT),
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    "CONVEYOR__EXECUTOR__CLAIM_TIMEOUT": "5",
}

# Each run appends "start <attempt>" and "end <attempt>" to a file named after its
# execution, in RUNS_DIR: what ran, as the action bodies saw it, whatever the database says.
ACTIONS = """\
import os
import time

from conveyor import action
from conveyor.actions.context import current


def _record(event: str) -> None:
    ctx = current()
    with open(os.path.join(os.environ["RUNS_DIR"], str(ctx.execution_id)), "a") as f:
        f.write(f"{event} {ctx.attempt}\\n")


def _run(seconds: float) -> float:
    _record("start")
    time.sleep(seconds)
    _record("end")
    return seconds


@action("restart.once", on_worker_lost="abandon")
def once(seconds: float) -> float:
    return _run(seconds)


@action("restart.again")
def again(seconds: float) -> float:
    return _run(seconds)
"""


@pytest.fixture
def env(private_pg: PrivatePostgres, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "restartmod.py").write_text(ACTIONS)
    (tmp_path / "runs").mkdir()
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path / "mods"), os.environ.get("PYTHONPATH")]))
    return conveyor_env(private_pg.url, **SETTINGS, PYTHONPATH=pythonpath, RUNS_DIR=str(tmp_path / "runs"))


@pytest.fixture
def forwarder(private_pg: PrivatePostgres) -> Iterator[Forwarder]:
    with Forwarder("127.0.0.1", ("127.0.0.1", private_pg.port)) as fwd:
        yield fwd


def _connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(
        url, autocommit=True, row_factory=dict_row, connect_timeout=3, options=f"-c search_path={SCHEMA}"
    )


def _rows(url: str, query: str, params: Mapping[str, Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with _connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _runs(runs: Path, eid: int) -> list[str]:
    path = runs / str(eid)
    return path.read_text().splitlines() if path.exists() else []


def _crash_a_backend(url: str) -> None:
    """SIGKILL one backend: the postmaster kills every other session and reinitialises
    shared memory (all advisory locks gone), but pg_postmaster_start_time() stays."""
    with _connect(url) as conn:
        before = conn.execute("SELECT pg_postmaster_start_time() AS t").fetchone()
        pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert before is not None
        assert pid is not None
        os.kill(pid["pid"], signal.SIGKILL)

    def back() -> bool:
        row = _rows(url, "SELECT pg_postmaster_start_time() AS t")[0]
        assert row["t"] == before["t"], "a crash of one backend does not restart the postmaster"
        return True

    eventually(back, timeout=30, interval=0.1)


def _start_services(procs: Procs, env: dict[str, str], worker_url: str) -> tuple[Proc, Proc]:
    executor = procs.start("executor", name="executor", env=env)
    worker_env = {**env, "DATABASE_URL": worker_url}
    worker = procs.start("worker", "--name", "w1", "--import", "restartmod", name="worker", env=worker_env)
    executor.wait_for_log("executor started")
    worker.wait_for_log("worker registered")
    return executor, worker


# -- 1. a crash-restart is not a lost worker -----------------------------------------------------


@pytest.mark.parametrize("fault", ["restart-immediate", "backend-crash", "backend-crash-late-return", "stopped"])
def test_crash_restart_keeps_running_work(
    private_pg: PrivatePostgres, procs: Procs, env: dict[str, str], forwarder: Forwarder, tmp_path: Path, fault: str
) -> None:
    url, runs = private_pg.url, tmp_path / "runs"
    # In one case the worker goes through the forwarder (direct otherwise, as in production).
    via = make_conninfo(url, host=forwarder.host, port=str(forwarder.port))
    executor, worker = _start_services(procs, env, via if fault == "backend-crash-late-return" else url)

    def logs() -> str:
        return procs.logs() + "\n" + private_pg.logs()

    # Long runs span the fault; with the server stopped, the short ones end meanwhile and
    # their results wait in the worker.
    plan = [("restart.once", 6.0), ("restart.again", 6.0), ("restart.once", 2.0), ("restart.again", 2.0)]
    with _connect(url) as conn:
        ids = [request_execution(conn, ref, {"seconds": seconds}) for ref, seconds in plan]
    short = ids[2:]

    def all_started() -> bool:
        rows = _rows(url, "SELECT id, status FROM execution")
        return all(r["status"] == "running" for r in rows) and all(_runs(runs, eid) for eid in ids)

    eventually(all_started, timeout=20, message=logs)

    if fault == "restart-immediate":
        private_pg.restart("immediate")
    elif fault == "backend-crash":
        _crash_a_backend(url)
    elif fault == "backend-crash-late-return":
        # The worker's sessions (and the server's last words on them) get through, but not
        # its reconnections: the server is back for the executor, and the worker's lock is
        # still missing, in what is -- by the postmaster's start time -- the same server.
        forwarder.closing.set()
        _crash_a_backend(url)

        def still_active() -> bool:
            return bool(_rows(url, "SELECT status FROM worker WHERE name = 'w1'")[0]["status"] == "active")

        stays(still_active, duration=2.0, message="the worker was declared dead while it was coming back")
        held = _rows(url, "SELECT worker_lock_held(id) AS held FROM worker WHERE name = 'w1'")[0]["held"]
        assert held is False, "the scenario did not happen: the worker's lock was back already"
        forwarder.closing.clear()
    else:
        private_pg.stop("immediate")
        stopped = time.time()
        # The short runs end while no server is up: their results wait in the worker.
        eventually(lambda: all(len(_runs(runs, eid)) == 2 for eid in short), timeout=5, message=logs)
        ended_meanwhile = all((runs / str(eid)).stat().st_mtime >= stopped for eid in short)
        private_pg.start()
        assert ended_meanwhile, "the scenario did not happen: the short runs ended before the server stopped"

    def all_ended() -> list[dict[str, Any]] | None:
        rows = _rows(url, "SELECT id, status, attempt FROM execution ORDER BY id")
        return rows if all(r["status"] in TERMINAL for r in rows) else None

    ended = eventually(all_ended, timeout=30, interval=0.2, message=logs)
    assert [(r["id"], r["status"], r["attempt"]) for r in ended] == [(eid, "completed", 1) for eid in ids], logs()
    attempts = _rows(url, "SELECT execution, attempt, outcome FROM execution_attempt ORDER BY execution, attempt")
    assert [(a["execution"], a["attempt"], a["outcome"]) for a in attempts] == [(eid, 1, "completed") for eid in ids], (
        logs()
    )
    # Each body ran exactly once: the runs as the actions recorded them.
    assert {eid: _runs(runs, eid) for eid in ids} == {eid: ["start 1", "end 1"] for eid in ids}, logs()

    assert "worker lost its standing" not in worker.stderr(), worker.logs()
    assert "marking as inactive" not in executor.stderr(), executor.logs()
    eventually(lambda: _rows(url, "SELECT status FROM worker WHERE name = 'w1'")[0]["status"] == "active")
    for p in (worker, executor):
        assert p.returncode is None, p.logs()
        assert "Traceback" not in p.stderr(), p.logs()


# -- 2. started while the server is down ---------------------------------------------------------


def test_services_started_while_the_server_is_down_wait_for_it(
    private_pg: PrivatePostgres, procs: Procs, env: dict[str, str]
) -> None:
    private_pg.stop()
    executor = procs.start("executor", name="executor", env=env)
    worker = procs.start("worker", "--name", "w1", "--import", "restartmod", name="worker", env=env)

    # Each retry is logged; two of them each show that the process waits instead of exiting.
    def retried_twice(proc: Proc) -> bool:
        assert proc.returncode is None, f"{proc.name} exited while the server was down\n{proc.logs()}"
        return proc.stderr().count("database unreachable at start; retrying") >= 2

    for proc in (executor, worker):
        eventually(functools.partial(retried_twice, proc), timeout=20, message=procs.logs)

    private_pg.start()
    executor.wait_for_log("executor started", timeout=30)
    worker.wait_for_log("worker registered", timeout=30)
    with _connect(private_pg.url) as conn:
        eid = request_execution(conn, "restart.again", {"seconds": 0})

    def done() -> str | None:
        status: str = _rows(private_pg.url, "SELECT status FROM execution WHERE id = %s", (eid,))[0]["status"]
        return status if status in TERMINAL else None

    assert eventually(done, timeout=20, message=procs.logs) == "completed"
    assert _runs(Path(env["RUNS_DIR"]), eid) == ["start 1", "end 1"]
    for p in (worker, executor):
        assert p.returncode is None, p.logs()
        assert "Traceback" not in p.stderr(), p.logs()


def test_a_server_that_refuses_the_connection_is_an_error_at_once(db_url: str) -> None:
    """Waiting is for a server that is down or starting: one that answers and refuses (here:
    no such database) stays an error, one line and exit code 1."""
    url = psycopg.conninfo.make_conninfo(db_url, dbname="conveyor_no_such_database")
    result = run_cli("worker", "--name", "w-refused", env=conveyor_env(url), timeout=60)
    assert result.returncode == 1, describe(result)
    assert 'database "conveyor_no_such_database" does not exist' in result.stderr, describe(result)
    assert "retrying" not in result.stderr, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
