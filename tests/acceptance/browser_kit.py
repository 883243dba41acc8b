"""What the dashboard's browser tests share: where Chromium is, the check that it and
Playwright are there (a skip locally, a failure when ``CI=true``), a clean folder for a test's
screenshots (kept after the run under ``$CONVEYOR_TEST_ARTIFACTS``, default ``test-artifacts/``,
git-ignored), and a ``conveyor api`` started on a free port."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from acceptance.helpers import Procs

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
