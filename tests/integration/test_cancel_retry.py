"""A cancel that the database rolls back to break a deadlock runs again (drive.run's retries,
``database.verb_retries``) for every caller: the SDK (and so the CLI) and the API. Past the
bound the API answers 503 with a message and Retry-After, never a 500.

The lock order of migration 0033 leaves no cycle between a cancel and the executor that a
test could play step by step, so an adversary makes one: it holds the workflow's execution
row, and once the cancel (holding the state row KEY SHARE) waits for it, asks for the state
row FOR UPDATE. The adversary's deadlock_timeout is long: the cancel, which waited first,
always detects the cycle and is the side aborted. The adversary's lock can only be granted
once that first attempt of the cancel is rolled back: its success proves the retry ran."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from conveyor.config import Settings
from conveyor.sdk import Client
from conveyor.store.db import connect_sync
from integration.api_kit import LIMIT, Api
from integration.builders import Conn
from integration.workflows.test_cancel_tree import scalar, synthetic_tree
from support.polling import eventually


class Adversary:
    """A transaction taking a workflow's rows against the order: execution, then state row."""

    def __init__(self, db_url: str, execution: int) -> None:
        self.conn = connect_sync(db_url, "conveyor")
        self.pid = self.conn.info.backend_pid
        self.execution = execution
        self.conn.execute("SET deadlock_timeout = '60s'")  # the cancel detects the cycle, never this side
        self.conn.execute("SET lock_timeout = '20s'")  # a bug must not hang the test
        self.conn.execute("SELECT 1 FROM execution WHERE id = %s FOR NO KEY UPDATE", (execution,))

    def close_cycle(self) -> None:
        """Wait for the state row the cancel holds: granted once the cancel is aborted."""
        self.conn.execute("SELECT 1 FROM workflow_execution WHERE execution = %s FOR UPDATE", (self.execution,))

    def waiter(self, conn: Conn) -> int | None:
        """The session waiting for one of this transaction's locks (the cancel's)."""
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (self.pid,))
        found = row.fetchone()
        return int(found["pid"]) if found else None

    def play(self, conn: Conn, retried: bool) -> None:
        """The race, once the cancel waits for the execution row: the cycle, then (if the
        cancel runs again, now waiting for the state row) the end of this transaction."""
        eventually(lambda: self.waiter(conn), timeout=10, interval=0.01, message="the cancel does not wait")
        self.close_cycle()
        if retried:
            eventually(lambda: self.waiter(conn), timeout=10, interval=0.01, message="no second attempt waits")
        self.conn.rollback()
        self.conn.close()


@pytest.mark.parametrize("policy", [None, "cancel_running"])
def test_the_sdk_runs_a_cancel_the_database_rolled_back_again(db_url: str, conn: Conn, policy: str | None) -> None:
    root, _, _ = synthetic_tree(conn, 1)
    adversary = Adversary(db_url, root)
    outcome: dict[str, Any] = {}

    def cancel() -> None:
        with Client(db_url) as client:  # database.verb_retries' default
            try:
                outcome["status"] = client.cancel(root, by="tester", policy=policy)
            except psycopg.Error as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=cancel, daemon=True)
    thread.start()
    adversary.play(conn, retried=True)
    thread.join(30)
    assert not thread.is_alive()
    assert outcome == {"status": "canceling"}
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == "canceling"


def test_past_its_retries_the_sdk_raises_the_deadlock(db_url: str, conn: Conn) -> None:
    root, _, _ = synthetic_tree(conn, 1)
    adversary = Adversary(db_url, root)
    outcome: dict[str, Any] = {}

    def cancel() -> None:
        with Client(db_url, verb_retries=0) as client:
            try:
                outcome["status"] = client.cancel(root, by="tester")
            except psycopg.Error as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=cancel, daemon=True)
    thread.start()
    adversary.play(conn, retried=False)
    thread.join(30)
    assert isinstance(outcome.get("error"), psycopg.errors.DeadlockDetected), outcome
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == "running"  # rolled back


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Settings:
    retries = getattr(request, "param", 3)
    return Settings(
        api={"max_body_bytes": LIMIT, "stream_interval": 0.05, "database_timeout": 10},
        database={"verb_retries": retries},
    )


@pytest.mark.parametrize("settings", [3, 0], indirect=True, ids=["retries=3", "retries=0"])
async def test_the_api_retries_a_cancel_then_answers_503(api: Api, db_url: str, conn: Conn, settings: Settings) -> None:
    retried = settings.database.verb_retries > 0
    root, _, _ = synthetic_tree(conn, 1)
    adversary = Adversary(db_url, root)
    request = asyncio.create_task(api.post(f"/api/v1/executions/{root}/cancel", json={"policy": "cancel_running"}))
    await asyncio.to_thread(adversary.play, conn, retried)
    response = await asyncio.wait_for(request, 30)
    if retried:
        assert response.status_code == 200, response.text
        assert response.json() == {"id": root, "status": "canceling"}
    else:
        assert response.status_code == 503, response.text
        assert response.json() == {
            "error": "the database rolled this request back (deadlock or serialization failure); retry"
        }
        assert response.headers["Retry-After"] == "2"
        assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == "running"
