"""Acceptance: why a worker went inactive (issue #15), with real ``conveyor`` processes: a
worker stopped with SIGTERM says ``stopped``, a SIGKILLed one what the executor's recovery
decided (its process gone), on ``conveyor workers list --json`` and on the Workers page
(HTTP), which also shows what a live worker runs now and what it offers; then the page in
Chromium, with a screenshot in ``$CONVEYOR_TEST_ARTIFACTS/workers`` (default
``test-artifacts/workers``). Every wait polls with a deadline."""

from __future__ import annotations

import re
import signal
from typing import Any

import httpx
import pytest

from acceptance.browser_kit import CHROMIUM, require_browser, screenshots
from acceptance.helpers import Procs, conveyor_env, until
from acceptance.recovery_kit import RECOVERY_SETTINGS, Conn, request, start_executor, start_worker, until_status
from conveyor.domain.tokens import Role, token_row
from conveyor.store.queries import Q

pytestmark = pytest.mark.acceptance

# A killed process loses every session at once: the sweep finds no session of it left
# (process_gone). On a loaded machine its pool's sessions may end a little after its
# liveness one, and past lock_grace the sweep says lock_lost: the same death, by the lock.
KILLED = {"process_gone", "lock_lost"}


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, **RECOVERY_SETTINGS)


def _listed(procs: Procs) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in procs.json("workers", "list")}


def _reason(db: Conn, name: str) -> str | None:
    found = db.execute("SELECT inactive_reason FROM worker WHERE name = %s AND status = 'inactive'", (name,)).fetchone()
    return None if found is None else found["inactive_reason"]


def _rows(page: str) -> dict[str, str]:
    """Each worker's row on the Workers page, by name, in page order."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<tr data-worker="([^"]+)".*?</tr>', page, re.S)}


def test_stopped_and_killed_workers_say_why_on_the_cli_and_the_page(
    procs: Procs, env: dict[str, str], db: Conn
) -> None:
    start_executor(procs, env)
    api = procs.start("api", name="api")
    api.wait_for_log("API listening", timeout=30)
    match = re.search(r"url=(http://[0-9.]+:\d+)", api.stderr() + api.stdout())
    assert match, api.logs()
    base = match.group(1)

    busy = start_worker(procs, env, "w-busy")
    long = request(db, "core.sleep", {"seconds": 120})
    until_status(procs, db, long, {"running"})
    stopping = start_worker(procs, env, "w-stopped")
    victim = start_worker(procs, env, "w-killed")

    stopping.signal(signal.SIGTERM)
    assert stopping.wait(30) == 0
    victim.kill()
    until(procs, lambda: _reason(db, "w-killed") in KILLED, timeout=20)

    listed = _listed(procs)
    assert {n: (w["status"], w["inactive_reason"]) for n, w in listed.items()} == {
        "w-busy": ("active", None),
        "w-stopped": ("inactive", "stopped"),
        "w-killed": ("inactive", _reason(db, "w-killed")),
    }
    for name in ("w-stopped", "w-killed"):
        assert listed[name]["inactive_since"] is not None
        assert 0 <= listed[name]["inactive_age"] < 60
    assert listed["w-busy"]["inactive_since"] is None
    table = procs.run("workers", "list", env={**env, "COLUMNS": "200"})
    assert "inactive: stopped" in table.stdout, table.stdout

    token, params = token_row("workers test", Role.viewer)
    db.execute(Q["create_token"], params)
    with httpx.Client(base_url=base, cookies={"conveyor_token": token}, timeout=10) as viewer:
        for path in ("/workers", "/_live/workers"):
            page = viewer.get(path)
            assert page.status_code == 200, page.text
            rows = _rows(page.text)
            assert list(rows) == ["w-busy", "w-killed", "w-stopped"]  # live ones first
            assert 'data-inactive-reason="stopped"' in rows["w-stopped"]
            assert f'data-inactive-reason="{_reason(db, "w-killed")}"' in rows["w-killed"]
            assert 'data-inactive-reason=""' in rows["w-busy"]
            assert f'data-execution="{long}"' in rows["w-busy"]  # what it runs now
            assert "core.sleep" in rows["w-busy"]
            assert "core.echo" in rows["w-busy"]  # what it offers
            assert "data-execution" not in rows["w-stopped"]

    _in_chromium(base, token, busy.name, long)


def _in_chromium(base: str, token: str, busy: str, running: int) -> None:
    require_browser()
    from playwright.sync_api import expect, sync_playwright

    folder = screenshots("workers")
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(15_000)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
            page.goto(f"{base}/login?next=%2Fworkers")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/workers")
            stopped = page.locator('#workers tr[data-worker="w-stopped"]')
            expect(stopped.locator(".why .badge")).to_have_text("stopped")
            expect(stopped.locator(".why .since")).to_contain_text("ago")
            expect(page.locator('#workers tr[data-worker="w-killed"] .why .badge')).to_have_text(
                re.compile("process_gone|lock_lost")
            )
            live = page.locator(f'#workers tr[data-worker="{busy.removeprefix("worker-")}"]')
            expect(live.locator(f'li[data-execution="{running}"]')).to_contain_text("core.sleep")
            live.locator("details summary").click()
            expect(live.locator("ul.refs")).to_contain_text("core.echo")
            expect(page.locator("#live-status")).to_contain_text("live")
            page.screenshot(path=str(folder / "01-workers.png"), full_page=True)
            print(f"screenshot: {folder / '01-workers.png'}")
        finally:
            browser.close()
    assert problems == [], problems
