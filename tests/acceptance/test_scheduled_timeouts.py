"""Acceptance: the seeds' timeout scenarios with real ``conveyor`` processes against a real
PostgreSQL: a worker that never picks up its work, and one that stops mid-execution of
an action whose policy is to abandon. Every wait polls the database with a
deadline; the assertions are about what the execution records show."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, until
from acceptance.recovery_kit import (
    NOT_PICKED_UP,
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
    until_status,
    worker_row,
)
from conveyor.sdk import request_executions
from conveyor.store.db import connect_sync

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    """Every scenario runs on both transports: the same executor and worker code."""
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **transport_env)


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
    victim, _ = running_on(procs, db, eid, workers)
    workers[victim].kill()

    done = until_status(procs, db, eid, TERMINAL, timeout=10)
    assert done["status"] == "abandoned", done
    assert done["result"]["error"] == "worker lost"
    assert done["attempt"] == 1
    assert summary(attempts(db, eid)) == [(1, victim, "worker_lost")]


def test_prefetched_work_waits_behind_slow_actions_without_timing_out(
    procs: Procs, env: dict[str, str], db: Conn
) -> None:
    """A worker's prefetch (executions placed on it beyond its slots) waits for a slot of
    a worker that is taking work: neither the schedule-to-start monitor nor the dispatch
    TTL may take it back, though it waits longer than both; and it runs one slot at a time."""
    start_executor(
        procs,
        env,
        CONVEYOR__EXECUTOR__SCHEDULED_TIMEOUT=1,
        CONVEYOR__EXECUTOR__TIMEOUT_CHECK_INTERVAL=0.3,
        CONVEYOR__DEAD_LETTER__CHECK_INTERVAL=0.3,
        CONVEYOR__MESSAGE_QUEUE__RABBITMQ__WORKER_QUEUE_TTL_MS=1000,
    )
    start_worker(procs, env, "w-one", CONVEYOR__WORKER__MAX_CONCURRENT_TASKS=1, CONVEYOR__WORKER__PREFETCH=2)
    slow = request_executions(db, [("core.sleep", {"seconds": 1.5})] * 3)

    def statuses() -> list[str]:
        return sorted(execution(db, eid)["status"] for eid in slow)

    # One runs; two wait in the worker's prefetch, scheduled on it.
    until(procs, lambda: statuses() == ["running", "scheduled", "scheduled"], timeout=10)
    assert {execution(db, eid)["worker_name"] for eid in slow} == {"w-one"}
    for eid in slow:
        done = until_status(procs, db, eid, TERMINAL, timeout=20)
        assert done["status"] == "completed", done
        assert summary(attempts(db, eid)) == [(1, "w-one", "completed")]
    # One slot: each started when (in the very transaction) the one before ended.
    spans = sorted((execution(db, eid)["started"], execution(db, eid)["ended"]) for eid in slow)
    for (_, ended), (started, _) in pairwise(spans):
        assert ended <= started, spans
