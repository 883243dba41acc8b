"""Acceptance: the execution page shows live output as it comes (issue #15), in a real headless
Chromium against real ``executor``, ``worker`` and ``api`` processes: a command's first line
appears while it still runs, bytes that are not text are shown escaped and markup as text, the
page says when the output has ended, and a 10 MiB output page stays usable. Screenshots go to
``$CONVEYOR_TEST_ARTIFACTS/live-output`` (default ``test-artifacts/live-output``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.browser_kit import CHROMIUM, require_browser, screenshots, start_api
from acceptance.helpers import Procs, conveyor_env, describe, eventually
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]
TEN_MIB = 10 * 1024 * 1024


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, worker__output_interval=0.05)


def test_in_chromium_the_execution_page_follows_its_output(procs: Procs, db: Db, tmp_path: Path) -> None:
    require_browser()
    from playwright.sync_api import expect, sync_playwright

    artifacts = screenshots("live-output")

    procs.start("executor", name="executor")
    procs.start("worker", name="worker")
    base = start_api(procs)
    created = procs.run("tokens", "create", "--role", "viewer", "--name", "live output test")
    assert created.returncode == 0, describe(created)
    token = created.stdout.strip().splitlines()[-1]
    eventually(lambda: db.execute("SELECT 1 FROM worker WHERE status = 'active'").fetchone(), timeout=30,
               message=procs.logs)  # fmt: skip
    gate = tmp_path / "gate"
    command = (f"echo 'first line <b>not bold</b>'; printf 'nul \\0 latin \\351\\n' >&2; "
               f"while [ ! -e {gate} ]; do sleep 0.05; done; echo 'second line'")  # fmt: skip
    eid = request_execution(db, "core.local", {"cmd": command})
    big = request_execution(db, "core.local", {"cmd": f"yes 'a line of output' | head -c {TEN_MIB}"})

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
        try:
            page.goto(f"{base}/login")
            page.fill("#token", token)
            page.click("button[type=submit]")
            page.goto(f"{base}/executions/{eid}")
            live = page.locator("#execution-live-output")
            expect(live).to_contain_text("first line <b>not bold</b>")  # as text: no markup ran
            expect(live.locator(".stream-stderr")).to_have_text("nul \\x00 latin \\xe9\n")
            expect(page.locator("#live-output-state")).to_contain_text("Following")
            assert db.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone() == {"status": "running"}
            page.screenshot(path=str(artifacts / "01-running.png"), full_page=True)
            gate.touch()
            expect(page.locator("#live-output-state")).to_have_text("Ended: all of its output is above.",
                                                                    timeout=30_000)  # fmt: skip
            expect(live).to_contain_text("second line")
            expect(live.locator("b")).to_have_count(0)
            page.screenshot(path=str(artifacts / "02-ended.png"), full_page=True)

            page.goto(f"{base}/executions/{big}")
            expect(page.locator("#live-output-state")).to_have_text("Ended: all of its output is above.",
                                                                    timeout=120_000)  # fmt: skip
            stdout = "e => [...e.querySelectorAll('.stream-stdout')].reduce((n, s) => n + s.textContent.length, 0)"
            assert live.evaluate(stdout) == TEN_MIB  # every byte, up to worker.output_limit (10 MiB)
            page.screenshot(path=str(artifacts / "03-ten-mib.png"))  # the viewport: the page is 10 MiB tall
        finally:
            browser.close()
    assert not problems, problems
