"""Acceptance: workflows advanced by several executor replicas at once, under duplicate
completions, with real processes.

Three replicas run the advancing duty on the same workflows (woken by the same NOTIFYs,
polling every 0.2 s), while a replayer re-inserts the completion event of every child
that ended -- each time after the first was applied -- and copies the wake-ups: each
completion must still be applied once (workflow_kit.check_workflows: the outputs of a
run without faults, one child per (task, item, retry) chain, each join fired once).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, until
from acceptance.recovery_kit import RECOVERY_SETTINGS, start_worker
from acceptance.workflow_kit import (
    SIGKILLED,
    TERMINAL,
    WORKFLOW_SETTINGS,
    Conn,
    all_ended,
    check_workflows,
    pending_events,
    register_all,
    request_mix,
    start_executor,
)

pytestmark = pytest.mark.acceptance


# Every ended child's completion, again: a duplicate of an event already applied (the
# unique index only stops a second copy while the first is still pending).
REPLAY = """
INSERT INTO workflow_event (workflow_execution, kind, execution)
SELECT w.id, 'child_ended', c.id
FROM execution c JOIN workflow_execution w ON w.execution = c.parent
WHERE c.parent = ANY(%s) AND c.status = ANY(%s)
ORDER BY w.id, c.id
ON CONFLICT DO NOTHING
"""


class Replayer(threading.Thread):
    def __init__(self, url: str, parents: list[int]) -> None:
        super().__init__(name="replayer", daemon=True)
        self.url, self.parents = url, parents
        self.stop = threading.Event()
        self.replayed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True, options="-c search_path=conveyor") as conn:
                while not self.stop.wait(0.02):
                    try:
                        self.replayed += conn.execute(REPLAY, (self.parents, list(TERMINAL))).rowcount
                    except psycopg.errors.DeadlockDetected:
                        # Its many-row insert takes key-share locks on workflow rows the
                        # replicas are updating; the server picked this side. The engine
                        # retries its own pass; a replaying client does the same.
                        continue
                    conn.execute("SELECT pg_notify('conveyor.workflow', '')")
        except BaseException as exc:
            self.error = exc


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **WORKFLOW_SETTINGS)


@pytest.fixture
def replayer(db_url: str) -> Iterator[list[Replayer]]:
    started: list[Replayer] = []
    yield started
    for r in started:
        r.stop.set()
        r.join(10)


def test_three_replicas_and_replayed_completions(
    procs: Procs, env: dict[str, str], db: Conn, db_url: str, replayer: list[Replayer]
) -> None:
    register_all(db)
    for name in ("wa", "wb"):
        start_worker(procs, env, name)
    made = request_mix(db, 30)
    replay = Replayer(db_url, list(made))
    replayer.append(replay)
    replay.start()
    for label in ("e1", "e2", "e3"):
        start_executor(procs, env, label)
    all_ended(procs, db, list(made))
    replay.stop.set()
    replay.join(10)
    assert replay.error is None, replay.error
    assert replay.replayed > 0, "no completion was replayed: the test tested nothing"
    # The last replays (after their workflows ended) are consumed too, changing nothing.
    until(procs, lambda: pending_events(db) == 0, timeout=10)
    check_workflows(db, made)


def test_one_replica_dies_mid_advancement_the_other_carries_on(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """Two replicas; one SIGKILLs itself inside its first advancement that requests
    children (before commit): the survivor alone finishes every workflow. The doomed one is
    up before the requests and the survivor starts after them, so the doomed one surely
    advances something (with batched passes, a 5th advancement of its own could not be
    counted on: found by CI)."""
    register_all(db)
    start_worker(procs, env, "wa")
    doomed = start_executor(procs, env, "doomed", CONVEYOR_FAILPOINTS="workflow.after_child_row")
    made = request_mix(db, 15)
    start_executor(procs, env, "survivor")
    assert doomed.wait(30) == SIGKILLED, doomed.logs()
    all_ended(procs, db, list(made))
    check_workflows(db, made)
