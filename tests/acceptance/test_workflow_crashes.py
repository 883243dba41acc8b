"""Acceptance: workflow advancement survives an executor SIGKILLed at every step of it,
with real executor and worker processes.

Each crash point of the advancing transaction (conveyor/failpoints.py: after the dispatch
rows, after the child rows, before commit, after commit) and the window before it (a
child's completion committed while no executor is alive): the doomed executor dies
there, a replacement starts, and the database must show every workflow completed with
the output of a run without faults, one child per (task, item, retry) chain, every
join fired once, nothing left to apply (workflow_kit.check_workflows). Then a worker
SIGKILLed under a workflow's task: the task is run again per the action's retry policy
(same child, a second attempt) and the workflow completes.
"""

from __future__ import annotations

import pytest

from acceptance.helpers import Procs, conveyor_env
from acceptance.recovery_kit import RECOVERY_SETTINGS, start_executor, start_worker
from acceptance.workflow_kit import (
    Conn,
    all_ended,
    check_workflows,
    register_all,
    request_mix,
)

pytestmark = pytest.mark.acceptance

# The workflow duty polls every 0.2 s: a replacement finds what a dead replica left at once.
WORKFLOW_SETTINGS = {"CONVEYOR__WORKFLOW__POLL_INTERVAL": "0.2"}


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **WORKFLOW_SETTINGS)


def test_workflows_run_to_completion_without_faults(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """The baseline the crash scenarios are held to: the same checks, nothing killed."""
    register_all(db)
    start_worker(procs, env, "wa")
    start_executor(procs, env)
    made = request_mix(db, 6)
    all_ended(procs, db, list(made))
    check_workflows(db, made)
