"""Acceptance: PostgreSQL fails over to an *asynchronous* standby that lags.

The standby's WAL receiver is stopped (SIGSTOP) while the primary goes on committing: a
lag, made certain. Meanwhile a request is acknowledged and two results are written on the
primary; then the primary crashes and the standby is promoted without them. What that
costs, and what Conveyor does about it:

- the acknowledged request is gone: nothing on the new primary knows it (no system built
  on an asynchronous replica can do better; only a synchronous standby keeps it);
- the two executions whose results were lost are ``running`` on the new primary, on a
  worker that finished them and is alive. They must not stay so for ever: the worker
  finds, once it is registered with the new server, that the database has executions on
  it that it ran and no longer runs -- results the database forgot -- and leaves them to
  recovery, which applies each action's lost-worker policy: run again as a new attempt
  (``retry``), or ``abandoned`` with the reason (``abandon``). Nothing is re-run under the
  same attempt, and nothing is stuck.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from acceptance.helpers import Procs, conveyor_env, eventually
from acceptance.pg_pair import PgPair, migrated_pair, replication_cut
from acceptance.recovery_kit import TERMINAL
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance

SCHEMA = "conveyor"
DBNAME = "conveyor"
SETTINGS = {
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": "3",
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    "CONVEYOR__RETRY__BACKOFF_BASE": "0.1",
}

ACTIONS = """\
import os
import time

from conveyor import action
from conveyor.actions.context import current


def _run(seconds: float) -> float:
    ctx = current()
    with open(os.path.join(os.environ["RUNS_DIR"], str(ctx.execution_id)), "a") as f:
        f.write(f"run {ctx.attempt}\\n")
    time.sleep(seconds)
    return seconds


@action("lag.retry")
def again(seconds: float) -> float:
    return _run(seconds)


@action("lag.once", on_worker_lost="abandon")
def once(seconds: float) -> float:
    return _run(seconds)
"""


@pytest.fixture
def pair() -> Iterator[PgPair]:
    with migrated_pair(synchronous=False, dbname=DBNAME, schema=SCHEMA) as servers:
        yield servers


@pytest.fixture
def env(pair: PgPair, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "lagmod.py").write_text(ACTIONS)
    (tmp_path / "runs").mkdir()
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path / "mods"), os.environ.get("PYTHONPATH")]))
    return conveyor_env(pair.url(DBNAME), **SETTINGS, PYTHONPATH=pythonpath, RUNS_DIR=str(tmp_path / "runs"))


def _rows(url: str, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=3,
                         options=f"-c search_path={SCHEMA}") as conn:  # fmt: skip
        return conn.execute(query, params).fetchall()


def _statuses(url: str, ids: list[int]) -> dict[int, str]:
    rows = _rows(url, "SELECT id, status FROM execution WHERE id = ANY(%s)", (ids,))
    return {r["id"]: r["status"] for r in rows}


def test_results_lost_by_an_asynchronous_standby_are_recovered_not_stuck(
    pair: PgPair, procs: Procs, env: dict[str, str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    old, new = pair.primary.url(DBNAME), pair.standby.url(DBNAME)

    def logs() -> str:
        return procs.logs() + "\n" + pair.logs()

    executor = procs.start("executor", name="executor", env=env)
    worker = procs.start("worker", "--name", "w1", "--import", "lagmod", name="w1", env=env)
    executor.wait_for_log("executor started")
    worker.wait_for_log("worker registered")

    with psycopg.connect(old, autocommit=True, options=f"-c search_path={SCHEMA}") as conn:
        again = request_execution(conn, "lag.retry", {"seconds": 1.5})
        once = request_execution(conn, "lag.once", {"seconds": 1.5})
    # Both running, as the standby knows it.
    eventually(lambda: set(_statuses(new, [again, once]).values()) == {"running"}, timeout=20, message=logs)

    with replication_cut(pair):
        with psycopg.connect(old, autocommit=True, options=f"-c search_path={SCHEMA}") as conn:
            acknowledged = request_execution(conn, "lag.retry", {"seconds": 0})
        # The primary has all three completed; the standby has none of it.
        ids = [again, once, acknowledged]
        eventually(lambda: set(_statuses(old, ids).values()) == {"completed"}, timeout=20, message=logs)
        pair.primary.stop("immediate")
        stopped = time.time()
    pair.standby.promote()

    # The acknowledged request is lost: the price of an asynchronous standby.
    assert _statuses(new, [acknowledged]) == {}, logs()
    assert (runs / str(acknowledged)).read_text().splitlines() == ["run 1"], "it did run, on the old primary"
    # The lost results: running on the new primary, on a worker that is done with them...
    assert _statuses(new, [again, once]) == {again: "running", once: "running"}, logs()

    # ... and not for ever: recovered per their lost-worker policy.
    def ended() -> dict[int, str] | None:
        found = _statuses(new, [again, once])
        return found if set(found.values()) <= TERMINAL else None

    final = eventually(ended, timeout=30, interval=0.2, message=logs)
    took = time.time() - stopped
    assert final == {again: "completed", once: "abandoned"}, logs()
    attempts = _rows(new, "SELECT execution, attempt, outcome FROM execution_attempt ORDER BY execution, attempt")
    assert [(a["execution"], a["attempt"], a["outcome"]) for a in attempts] == [
        (again, 1, "worker_lost"), (again, 2, "completed"), (once, 1, "worker_lost")], logs()  # fmt: skip
    # Run again as a new attempt (the retry policy), never twice under one attempt.
    assert (runs / str(again)).read_text().splitlines() == ["run 1", "run 2"], logs()
    assert (runs / str(once)).read_text().splitlines() == ["run 1"], logs()
    print(f"\nasynchronous failover: 1 acknowledged request lost; 2 results lost, recovered {took:.2f}s after "
          f"the stop: 1 run again (retry), 1 abandoned (abandon)")  # fmt: skip
    assert "the database forgot" in worker.stderr(), worker.logs()
    for p in (executor, worker):
        assert p.returncode is None, p.logs()
        assert "Traceback" not in p.stderr(), p.logs()
