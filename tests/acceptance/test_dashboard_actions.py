"""Acceptance (issue #15): acting from the dashboard in a real headless Chromium against
real ``executor``, ``worker`` and ``api`` processes: cancel a running execution, rerun a
finished one, replay a dead letter, create a token (shown once) and revoke it, each
through the REST API from the pages' buttons, confirmed in a dialog, the database saying
it was done. Screenshots go to ``$CONVEYOR_TEST_ARTIFACTS/actions`` (default
``test-artifacts/actions``), where they stay after the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from acceptance.browser_kit import CHROMIUM, require_browser, screenshots, start_fleet, status_of
from acceptance.helpers import Procs, conveyor_env, eventually
from conveyor.store.queries import Q

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]
DOORBELL = {"message_id": "m1", "message_type": "execution.requested", "created": "2024-01-01T00:00:00+00:00",
            "payload": {"execution_ids": []}}  # fmt: skip


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


@pytest.fixture
def artifacts() -> Path:
    return screenshots("actions")


def test_in_chromium_cancel_rerun_replay_and_tokens(procs: Procs, db: Db, artifacts: Path) -> None:
    require_browser()
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    base, token = start_fleet(procs, db, role="admin", label="actions test")
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=bearer, timeout=10) as api:
        sleeper = api.post("/api/v1/executions", json={"action_ref": "core.sleep", "parameters": {"seconds": 120}})
        echo = api.post("/api/v1/executions", json={"action_ref": "core.echo", "parameters": {"message": "again"}})
    assert sleeper.status_code == 201, sleeper.text
    assert echo.status_code == 201, echo.text
    sleeping, finished = sleeper.json()["id"], echo.json()["id"]
    eventually(lambda: status_of(db, finished) == "completed", timeout=30, message=procs.logs)
    eventually(lambda: status_of(db, sleeping) == "running", timeout=30, message=procs.logs)
    letter = db.execute(Q["record_dead_letter"], {
        "dedupe_key": "t-1", "message_id": "m1", "transport": "postgres", "reason": "expired", "queue": "q",
        "exchange": "x", "routing_key": "execution.requested", "message_type": "execution.requested",
        "payload": Jsonb(DOORBELL), "headers": Jsonb({}), "execution": None, "attempt": None, "worker": None,
        "error": None}).fetchone()["id"]  # type: ignore[index]  # fmt: skip

    shots: list[Path] = []
    problems: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as playwright:
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
            page.goto(f"{base}/login?next=/executions/{sleeping}")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/executions/{sleeping}")
            message = page.locator("#action-message")

            # Cancel the running sleep from its page: confirmed, then stopped by its worker.
            expect(page.locator("#execution-status")).to_have_text("running")
            page.click('#execution-actions button[data-kind="cancel"]')
            expect(message).to_have_attribute("data-state", "ok")
            expect(message).to_contain_text(f"Execution {sleeping}: ")
            expect(page.locator("#execution-status")).to_have_text("cancelled", timeout=30_000)
            assert status_of(db, sleeping) == "cancelled"
            assert dialogs[-1].startswith(f"Cancel execution {sleeping} (core.sleep)?"), dialogs
            shot("cancelled")

            # Rerun the finished echo from the executions list: a new execution, completed.
            page.click("nav >> text=Executions")
            row = page.locator(f'#executions tr[data-id="{finished}"]')
            expect(row.locator('button[data-kind="cancel"]')).to_have_count(0)
            row.locator('button[data-kind="rerun"]').click()
            expect(message).to_have_attribute("data-state", "ok")
            expect(message).to_contain_text(f"Rerun of {finished}: execution ")
            rerun = int(message.get_attribute("data-execution-id") or 0)
            assert rerun > finished, message.inner_text()
            expect(page.locator(f'#executions tr[data-id="{rerun}"]')).to_have_attribute(
                "data-status", "completed", timeout=30_000
            )
            parameters = db.execute("SELECT parameters FROM execution WHERE id = %s", (rerun,)).fetchone()
            assert parameters == {"parameters": {"message": "again"}}
            shot("rerun")

            # Replay the dead letter: confirmed, marked replayed, its button gone.
            page.click("nav >> text=Dead letters")
            letter_row = page.locator(f'#dead-letters tr[data-id="{letter}"]')
            letter_row.locator('button[data-kind="replay"]').click()
            expect(message).to_have_text(f"Dead letter {letter}: replayed.")
            expect(letter_row.locator("button")).to_have_count(0)
            resolution = db.execute("SELECT resolution FROM dead_letter WHERE id = %s", (letter,)).fetchone()
            assert resolution == {"resolution": "replayed"}
            assert dialogs[-1].startswith(f"Replay dead letter {letter}"), dialogs
            shot("replayed")

            # Create a token: shown once; it signs in to the API. Then revoke it.
            page.click("nav >> text=Tokens")
            page.fill("#token-name", "made in chromium")
            page.select_option("#token-role", "viewer")
            page.click("#token-submit")
            expect(message).to_have_attribute("data-state", "ok")
            expect(page.locator("#token-created")).to_be_visible()
            secret = page.locator("#token-secret").inner_text()
            new_id = int(message.get_attribute("data-token-id") or 0)
            assert secret.startswith("cvy_"), secret
            with httpx.Client(base_url=base, timeout=10) as api:
                assert api.get("/api/v1/executions", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
            new_row = page.locator(f'#tokens tr[data-id="{new_id}"]')
            expect(new_row).to_contain_text("made in chromium")
            expect(new_row).to_have_attribute("data-revoked", "false")
            shot("token-created")
            new_row.locator('button[data-kind="revoke"]').click()
            expect(message).to_have_text(f"Token {new_id} revoked.")
            expect(new_row).to_have_attribute("data-revoked", "true")
            revoked = db.execute("SELECT revoked IS NOT NULL AS gone FROM api_token WHERE id = %s", (new_id,))
            assert revoked.fetchone() == {"gone": True}
            assert dialogs[-1].startswith(f"Revoke token {new_id} (made in chromium, viewer)?"), dialogs
            shot("token-revoked")
        except (AssertionError, PlaywrightError):
            shot("failure")
            raise
        finally:
            browser.close()

    expected = "console: Failed to load resource: the server responded with a status of 4"
    assert [p for p in problems if not p.startswith(expected)] == [], problems
    assert len(shots) == 5
    assert all(p.stat().st_size > 0 for p in shots)
