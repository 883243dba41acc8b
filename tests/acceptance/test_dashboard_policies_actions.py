"""Acceptance (issue #15): /policies and /actions in a real headless Chromium against real
``executor``, ``worker`` and ``api`` processes: set a policy from the page, see an
execution waiting in its queue with its position, delete the policy (confirmed) and see it
released, then open an action's page: its schema, the worker offering it and a recent
outcome. Screenshots go to ``$CONVEYOR_TEST_ARTIFACTS/policies-actions`` (default
``test-artifacts/policies-actions``), where they stay after the run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from acceptance.browser_kit import CHROMIUM, require_browser, screenshots, start_fleet, status_of
from acceptance.helpers import Procs, conveyor_env, eventually

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


@pytest.fixture
def artifacts() -> Path:
    return screenshots("policies-actions")


def test_in_chromium_policy_queue_and_action_page(procs: Procs, db: Db, artifacts: Path) -> None:
    require_browser()
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    base, token = start_fleet(procs, db, role="admin", label="policies test")
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    shots: list[Path] = []
    problems: list[str] = []
    dialogs: list[str] = []
    with api, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))

        def accept(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.accept()

        page.on("dialog", accept)

        def shot(name: str) -> None:
            path = artifacts / f"{len(shots) + 1:02d}-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)
            print(f"screenshot: {path}")

        try:
            page.goto(f"{base}/login?next=/policies")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/policies")
            message = page.locator("#policy-message")

            # Set a limit of one core.sleep at once from the form.
            page.fill("#policy-target", "core.sleep")
            page.fill("#policy-concurrency", "1")
            page.click("#policy-submit")
            expect(message).to_have_attribute("data-state", "ok")
            expect(message).to_have_text("Policy core.sleep set: at most 1 at once (enqueue).")
            expect(page.locator('#policies tr[data-target="core.sleep"]')).to_be_visible()
            policy = db.execute("SELECT concurrency, source FROM admission_policy WHERE target = 'core.sleep'")
            assert policy.fetchone() == {"concurrency": 1, "source": "operator"}

            # Two sleeps: one holds the slot, the other waits first in the queue.
            ids = []
            for _ in range(2):
                response = api.post(
                    "/api/v1/executions", json={"action_ref": "core.sleep", "parameters": {"seconds": 120}}
                )
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
            holder, waiter = ids
            panel = page.locator('section[data-policy="core.sleep"]')
            expect(panel.locator(f'table.slots tr[data-id="{holder}"]')).to_be_visible()
            expect(panel.locator(f'table.queue tr[data-id="{waiter}"]')).to_have_attribute("data-position", "1")
            assert status_of(db, waiter) == "requested"
            shot("waiting-in-queue")

            # Delete it: confirmed; the waiter is released and runs.
            page.click('button[data-policy-delete="core.sleep"]')
            expect(message).to_have_text("Policy core.sleep deleted; 1 waiting execution(s) released.")
            assert dialogs[-1].startswith("Delete the policy for core.sleep?"), dialogs
            expect(page.locator('#policies tr[data-target="core.sleep"]')).to_have_count(0)
            assert db.execute("SELECT 1 FROM admission_policy WHERE target = 'core.sleep'").fetchone() is None
            eventually(lambda: status_of(db, waiter) == "running", timeout=30, message=procs.logs)
            shot("deleted")
            for eid in ids:
                assert api.post(f"/api/v1/executions/{eid}/cancel").status_code == 200
            eventually(lambda: all(status_of(db, e) == "cancelled" for e in ids), timeout=30, message=procs.logs)

            # The action's page: its schema, the worker offering it, its recent outcomes.
            page.click("nav >> text=Actions")
            expect(page.locator('#actions tr[data-ref="core.sleep"] td.workers')).to_have_text("w1")
            page.click('#actions a[href="/actions/core.sleep"]')
            expect(page).to_have_url(f"{base}/actions/core.sleep")
            expect(page.locator("#action-schema")).to_contain_text('"seconds"')
            expect(page.locator('#action-workers tr[data-worker="w1"]')).to_be_visible()
            expect(page.locator(f'#action-recent tr[data-id="{holder}"]')).to_have_attribute("data-status", "cancelled")
            expect(page.locator('#action-hour [data-status="cancelled"]')).to_have_text("cancelled 2")
            shot("action")
            page.click("#action-request")
            expect(page.locator("#request-action")).to_have_value("core.sleep")
            expect(page.locator("#request-parameters")).to_have_value(re.compile('"seconds"'))  # its skeleton
            shot("request-form")
        except (AssertionError, PlaywrightError):
            shot("failure")
            raise
        finally:
            browser.close()

    expected = "console: Failed to load resource: the server responded with a status of 4"
    assert [p for p in problems if not p.startswith(expected)] == [], problems
    assert len(shots) == 4
    assert all(p.stat().st_size > 0 for p in shots)
