"""What the dashboard's browser tests share: where Chromium is, the check that it and
Playwright are there (a skip locally, a failure when ``CI=true``), a clean folder for a test's
screenshots (kept after the run under ``$CONVEYOR_TEST_ARTIFACTS``, default ``test-artifacts/``,
git-ignored), a ``conveyor api`` started on a free port, and the fleet a page test drives."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Procs, describe, eventually

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"  # kept after the run (git-ignored)


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing browser fails the run)")
    pytest.skip(reason)


def require_browser() -> None:
    """Chromium and Playwright are installed, or the test is skipped (failed in CI)."""
    if not CHROMIUM.exists():
        unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[dev]')")


def screenshots(name: str) -> Path:
    """This run's screenshot folder ``name``, emptied of an earlier run's."""
    folder = Path(os.environ.get("CONVEYOR_TEST_ARTIFACTS") or ARTIFACTS) / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def start_api(procs: Procs) -> str:
    """Start ``conveyor api`` on a free port; its base URL, from its log."""
    api = procs.start("api", name="api")
    api.wait_for_log("API listening", timeout=30)
    match = re.search(r"url=(http://[0-9.]+:\d+)", api.stderr() + api.stdout())
    assert match, api.logs()
    return match.group(1)


def start_fleet(procs: Procs, db: psycopg.Connection[dict[str, Any]], *, role: str, label: str) -> tuple[str, str]:
    """An executor, a worker ``w1`` and the API, real processes; a token of ``role`` made by
    ``conveyor tokens create``. Returns the API's base URL and the token, once w1 is active."""
    procs.start("executor", name="executor")
    procs.start("worker", "--name", "w1", name="w1")
    base = start_api(procs)
    created = procs.run("tokens", "create", "--role", role, "--name", label)
    assert created.returncode == 0, describe(created)
    token = created.stdout.strip().splitlines()[-1]
    eventually(lambda: db.execute("SELECT 1 FROM worker WHERE name = 'w1' AND status = 'active'").fetchone(),
               timeout=30, message=procs.logs)  # fmt: skip
    return base, token


def status_of(db: psycopg.Connection[dict[str, Any]], eid: int) -> str | None:
    """An execution's status; None when there is no such row."""
    row = db.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone()
    return None if row is None else str(row["status"])
