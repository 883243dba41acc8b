"""Acceptance: inquiries answered in the dashboard, in a real headless Chromium (as
test_dashboard.py drives it) against real ``executor`` and ``api`` processes: the
pending list, a form generated from the inquiry's schema (a refusal shows the API's
paths), the answer completing the asking execution, and the JSON text area for a schema
the form cannot express."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually
from acceptance.test_dashboard import CHROMIUM, Db, _start_api, _unavailable
from acceptance.test_dashboard import artifacts as artifacts  # the fixture, shared

pytestmark = pytest.mark.acceptance

DEPLOY = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean", "title": "Approve the deploy"},
        "environment": {"enum": ["staging", "production"]},
        "replicas": {"type": "integer", "minimum": 1},
        "note": {"type": "string", "description": "why"},
    },
    "required": ["approved", "environment", "replicas"],
}
HOSTS = {"type": "object", "properties": {"hosts": {"type": "array", "items": {"type": "string"}}}}


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, CONVEYOR_USER="requester")


def _ask(procs: Procs, prompt: str, schema: dict[str, Any]) -> int:
    result = procs.run("run", "core.ask", f"prompt={prompt}", f"schema={json.dumps(schema)}")
    assert result.returncode == 0, describe(result)
    return int(result.stdout)


def _inquiry_of(db: Db, eid: int) -> int:
    row = eventually(lambda: db.execute("SELECT id FROM inquiry WHERE execution = %s", (eid,)).fetchone(), 20)
    return int(row["id"])


def _execution(db: Db, eid: int) -> dict[str, Any]:
    row = db.execute("SELECT status, result FROM execution WHERE id = %s", (eid,)).fetchone()
    assert row is not None
    return dict(row)


def test_in_chromium_an_inquiry_answered_with_its_form(procs: Procs, db: Db, artifacts: Path) -> None:
    if not CHROMIUM.exists():
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")

    procs.start("executor", name="executor")
    base = _start_api(procs)
    created = procs.run("tokens", "create", "--role", "operator", "--name", "approver")
    assert created.returncode == 0, describe(created)
    token = created.stdout.strip().splitlines()[-1]
    deploy = _ask(procs, "Deploy release 42?", DEPLOY)
    hosts = _ask(procs, "Which hosts?", HOSTS)
    deploy_inquiry, hosts_inquiry = _inquiry_of(db, deploy), _inquiry_of(db, hosts)

    shots: list[Path] = []
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))

        def shot(name: str) -> None:
            path = artifacts / f"inquiry-{len(shots) + 1:02d}-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)

        try:
            page.goto(f"{base}/inquiries")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/inquiries")
            row = page.locator(f'#inquiries tr[data-id="{deploy_inquiry}"]')
            expect(row).to_contain_text("Deploy release 42?")
            expect(row).to_contain_text("pending")
            expect(page.locator(f'#inquiries tr[data-id="{hosts_inquiry}"]')).to_contain_text("Which hosts?")
            shot("pending")
            row.get_by_role("link", name="Answer").click()
            expect(page).to_have_url(f"{base}/inquiries/{deploy_inquiry}")

            # The form, from the schema: a yes/no choice, an enum, an integer, a text.
            expect(page.locator("label[for=answer-approved]")).to_have_text("Approve the deploy *")
            expect(page.locator("#answer-environment option")).to_have_count(3)
            expect(page.locator("#answer-replicas")).to_have_attribute("type", "number")
            expect(page.locator("#answer-note")).to_have_attribute("type", "text")
            page.select_option("#answer-approved", label="yes")
            page.fill("#answer-replicas", "0")  # below the minimum; environment left out
            page.click("#inquiry-submit")
            message = page.locator("#inquiry-message")
            expect(message).to_have_attribute("data-state", "error")
            refusal = message.inner_text()
            shot("refused")
            assert _execution(db, deploy)["status"] == "pending"

            page.select_option("#answer-environment", label="production")
            page.fill("#answer-replicas", "3")
            page.fill("#answer-note", "after the freeze")
            page.click("#inquiry-submit")
            expect(message).to_have_text("Answered: the execution goes on.")
            expect(page.locator("#inquiry-status")).to_have_text("responded")  # the live part, not a reload
            expect(page.locator("#inquiry-responses")).to_contain_text("approver")
            shot("answered")

            # A schema the form cannot express: a JSON text area.
            page.goto(f"{base}/inquiries/{hosts_inquiry}")
            expect(page.locator("#answer-json")).to_be_visible()
            page.fill("#answer-json", '{"hosts": ["web1", 2]}')
            page.click("#inquiry-submit")
            expect(message).to_contain_text("data.hosts.1: 2 is not of type 'string' (HTTP 422)")
            page.fill("#answer-json", '{"hosts": ["web1", "web2"]}')
            page.click("#inquiry-submit")
            expect(message).to_have_text("Answered: the execution goes on.")
            expect(page.locator("#inquiry-status")).to_have_text("responded")
            shot("json-answered")
        except (AssertionError, PlaywrightError):
            shot("failure")
            raise
        finally:
            browser.close()

    assert re.fullmatch(
        r"Refused: invalid answer for inquiry \d+: data: 'environment' is a required property; "
        r"data.replicas: 0 is less than the minimum of 1 \(HTTP 422\)",
        refusal,
    ), refusal
    done = _execution(db, deploy)
    assert done["status"] == "completed", done
    answer = {"approved": True, "environment": "production", "replicas": 3, "note": "after the freeze"}
    assert (done["result"]["response"], done["result"]["responders"]) == (answer, ["approver"])
    assert _execution(db, hosts)["result"]["response"] == {"hosts": ["web1", "web2"]}
    expected = "console: Failed to load resource: the server responded with a status of 4"
    assert [p for p in problems if not p.startswith(expected)] == [], problems
    assert len(shots) == 4
