"""A pause or a resume that the database rolls back to break a deadlock runs again
(drive.run's retries, ``database.verb_retries``) for every caller, as a cancel does
(test_cancel_retry.py): the SDK (and so the CLI) and the API; past the bound the API
answers 503, never a 500. The same adversary closes a lock cycle step by step: it holds the
workflow's execution row and, once the verb (holding the state row KEY SHARE since
migration 0036) waits for it, asks for the state row FOR UPDATE; the verb, which waited
first, detects the cycle and is aborted. The adversary's lock is granted only once that
first attempt is rolled back, and the verb's success proves the retry ran."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from conveyor.config import Settings
from conveyor.sdk import Client
from integration.api_kit import LIMIT, Api
from integration.builders import Conn
from integration.test_cancel_retry import Adversary
from integration.workflows.test_cancel_tree import scalar, synthetic_tree

# verb -> (the workflow's status before, after)
VERBS = {"pause": ("running", "paused"), "resume": ("paused", "running")}


def workflow(conn: Conn, status: str) -> int:
    """A running workflow execution (with a running child), paused if ``status`` says so."""
    root, _, _ = synthetic_tree(conn, 1)
    if status == "paused":
        conn.execute("SELECT * FROM pause_execution(%s, 'tester')", (root,))
    return root


def in_thread(db_url: str, verb: str, root: int, retries: int) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def call() -> None:
        with Client(db_url, verb_retries=retries) as client:
            try:
                outcome["status"] = getattr(client, verb)(root, by="tester")
            except psycopg.Error as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_the_sdk_runs_a_pause_or_resume_the_database_rolled_back_again(db_url: str, conn: Conn, verb: str) -> None:
    before, after = VERBS[verb]
    root = workflow(conn, before)
    adversary = Adversary(db_url, root)
    thread, outcome = in_thread(db_url, verb, root, 3)
    adversary.play(conn, retried=True)
    thread.join(30)
    assert not thread.is_alive()
    assert outcome == {"status": after}
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == after
    assert scalar(conn, "SELECT count(*) FROM workflow_event WHERE kind = %s", verb) == 1  # once, not per attempt


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_past_its_retries_the_sdk_raises_the_deadlock(db_url: str, conn: Conn, verb: str) -> None:
    before, _ = VERBS[verb]
    root = workflow(conn, before)
    adversary = Adversary(db_url, root)
    thread, outcome = in_thread(db_url, verb, root, 0)
    adversary.play(conn, retried=False)
    thread.join(30)
    assert isinstance(outcome.get("error"), psycopg.errors.DeadlockDetected), outcome
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == before  # rolled back


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Settings:
    return Settings(
        api={"max_body_bytes": LIMIT, "stream_interval": 0.05, "database_timeout": 10},
        database={"verb_retries": request.param},
    )


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("settings", [3, 0], indirect=True, ids=["retries=3", "retries=0"])
async def test_the_api_retries_a_pause_or_resume_then_answers_503(
    api: Api, db_url: str, conn: Conn, settings: Settings, verb: str
) -> None:
    retried = settings.database.verb_retries > 0
    before, after = VERBS[verb]
    root = workflow(conn, before)
    adversary = Adversary(db_url, root)
    request = asyncio.create_task(api.post(f"/api/v1/executions/{root}/{verb}"))
    await asyncio.to_thread(adversary.play, conn, retried)
    response = await asyncio.wait_for(request, 30)
    if retried:
        assert response.status_code == 200, response.text
        assert response.json() == {"id": root, "status": after}
    else:
        assert response.status_code == 503, response.text
        assert response.json() == {
            "error": "the database rolled this request back (deadlock or serialization failure); retry"
        }
        assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == before
