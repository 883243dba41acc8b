"""Acceptance: ``conveyor executions purge`` as an operator uses it (issue #14). Finished
executions are made with SQL (backdated); every check goes through the real command line
in a subprocess."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest

from acceptance.helpers import conveyor_env, describe, run_cli
from integration.builders import finished, request

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _ids(db: Conn) -> set[int]:
    return {int(r["id"]) for r in db.execute("SELECT id FROM execution").fetchall()}


def _ok(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 0, describe(result)
    assert text in result.stdout, describe(result)
    assert "Traceback" not in result.stderr, describe(result)


def _fails(result: subprocess.CompletedProcess[str], text: str, code: int = 1) -> None:
    """A refusal in one line: the exit code, the message, no traceback."""
    assert result.returncode == code, describe(result)
    assert text in result.stderr, describe(result)
    assert "Traceback" not in result.stderr + result.stdout, describe(result)


def test_purge_asks_counts_and_deletes_only_what_it_should(db: Conn, env: dict[str, str]) -> None:
    old_done = [finished(db, "completed", days=40) for _ in range(3)]
    old_failed = finished(db, "failed", days=40)
    child = finished(db, "completed", days=40, parent=old_failed)
    young = finished(db, "completed", days=2)
    live = request(db)[0]
    everything = {*old_done, old_failed, child, young, live}

    # Not confirmed (no terminal to answer): nothing goes.
    _fails(run_cli("executions", "purge", "--older-than", "30d", env=env), "not confirmed; nothing purged")
    result = run_cli("executions", "purge", "--older-than", "30d", "--dry-run", env=env)
    _ok(result, "would purge 4 finished executions older than 30d")
    assert _ids(db) == everything

    result = run_cli("executions", "purge", "--older-than", "30d", "--status", "failed", "--yes", env=env)
    _ok(result, "purged 2 execution(s)")  # the failed one and its child
    assert _ids(db) == {*old_done, young, live}

    result = run_cli("executions", "purge", "--older-than", "30d", "-y", env=env)
    _ok(result, "purged 3 execution(s)")
    assert _ids(db) == {young, live}
    _ok(run_cli("executions", "purge", "--older-than", "1d", "--status", "failed", "-y", env=env), "no failed")
    assert _ids(db) == {young, live}


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("--older-than", "soon"), "'soon' is not an age", 1),
        (("--older-than", "30d", "--status", "running"), "only finished executions can be purged", 1),
        (("--status", "failed"), "Missing option '--older-than'", 2),
        (("--older-than", "30d", "--batch-size", "0"), "--batch-size", 2),
    ],
)
def test_bad_input_is_refused_in_one_line(
    db: Conn, env: dict[str, str], args: tuple[str, ...], message: str, code: int
) -> None:
    eid = finished(db, "completed", days=40)
    _fails(run_cli("executions", "purge", *args, "--yes", env=env), message, code)
    assert _ids(db) == {eid}
