"""Acceptance: the automation pages (issue #13) in a real headless Chromium, as
test_dashboard.py drives it, against real ``executor``, ``worker`` and ``api`` processes:
events → an event (its payload, with markup in it, shown as text) → the execution its
rule requested (which says what started it, and completes), then the schedules page and
a schedule's slots. The automation rows are written as the engines would leave them
(integration/automation_kit.py), in one transaction, so no engine sees the event
pending. Screenshots: ``$CONVEYOR_TEST_ARTIFACTS/automation`` (default ``test-artifacts/``)."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from psycopg.types.json import Jsonb

from acceptance.helpers import Procs, conveyor_env, describe, eventually
from acceptance.test_dashboard import ARTIFACTS, CHROMIUM, Db, _start_api, _unavailable
from integration.automation_kit import (
    EVALUATED,
    INSERT_ENFORCEMENT,
    INSERT_SCHEDULE,
    INSERT_SLOT,
    NEXT_ENFORCEMENT,
    REQUEST_FOR,
)

pytestmark = pytest.mark.acceptance

MARKUP = "<script>document.title='owned'</script><img src=x onerror=alert(1)>"


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


@pytest.fixture
def artifacts() -> Path:
    # A folder of its own, as test_workflow_graph_dashboard.py keeps: the other dashboard
    # tests empty theirs when they start.
    folder = Path(os.environ.get("CONVEYOR_TEST_ARTIFACTS") or ARTIFACTS) / "automation"
    shutil.rmtree(folder, ignore_errors=True)  # this run's screenshots only
    folder.mkdir(parents=True)
    return folder


def _id(db: Db, query: str, params: Any = None) -> int:
    row = db.execute(query, params).fetchone()
    assert row is not None
    return int(row["id"])


def _setup(db: Db) -> dict[str, int]:
    """A webhook event with markup in its payload, the rule that matched it and the
    core.echo execution it requested; a schedule with one slot that requested another."""
    with db.transaction():
        db.execute("SELECT register_trigger('github.push', 'webhook')")
        db.execute("SELECT register_rule('deploy-on-push', 'github.push', '{}', 'core.echo', '{}')")
        event = _id(
            db, "SELECT emit_event('github.push', %s, 'webhook') AS id", (Jsonb({"ref": "main", "note": MARKUP}),)
        )
        fid = _id(db, NEXT_ENFORCEMENT)
        params = Jsonb({"message": f"deploy main {MARKUP}"})
        execution = _id(db, REQUEST_FOR, ("core.echo", params, fid))
        db.execute(INSERT_ENFORCEMENT, (fid, "deploy-on-push", "deploy-on-push", event, "requested", execution,
                                        params, None))  # fmt: skip
        db.execute(EVALUATED, (event,))
        sid = _id(db, INSERT_SCHEDULE, ("nightly-report", "cron", "0 3 * * *", "Europe/Paris", None, "core.echo",
                                         None, "skip", "latest", False, "0 seconds"))  # fmt: skip
        # Its next slot as the schedules engine would store it: the next 03:00 in Paris.
        paris = datetime.now(ZoneInfo("Europe/Paris"))
        next_fire = paris.replace(hour=3, minute=0, second=0, microsecond=0)
        next_fire += timedelta(days=1) if next_fire <= paris else timedelta(0)
        db.execute("UPDATE schedule SET next_fire = %s WHERE id = %s", (next_fire, sid))
        slotted = _id(db, "SELECT request_execution('core.echo', '{\"message\": \"report\"}') AS id")
        slot = next_fire - timedelta(days=1)
        db.execute(INSERT_SLOT, (sid, slot, "scheduled", "requested", slotted, None, slot + timedelta(seconds=1)))
    return {"event": event, "enforcement": fid, "execution": execution, "slotted": slotted}


def test_in_chromium_events_event_execution_and_schedules(procs: Procs, db: Db, artifacts: Path) -> None:
    if not CHROMIUM.exists():
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")

    procs.start("executor", name="executor")
    procs.start("worker", "--name", "w1", name="w1")
    base = _start_api(procs)
    created = procs.run("tokens", "create", "--role", "viewer", "--name", "automation viewer")
    assert created.returncode == 0, describe(created)
    token = created.stdout.strip().splitlines()[-1]
    ids = _setup(db)

    shots: list[Path] = []
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
        page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))

        def shot(name: str) -> None:
            path = artifacts / f"automation-{len(shots) + 1:02d}-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)
            print(f"screenshot: {path}")

        try:
            page.goto(f"{base}/events")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/events")
            row = page.locator(f'#events tr[data-id="{ids["event"]}"]')
            expect(row).to_contain_text("github.push")
            expect(row).to_contain_text("1 requested")
            shot("events")

            row.get_by_role("link", name=str(ids["event"]), exact=True).click()
            expect(page).to_have_url(f"{base}/events/{ids['event']}")
            expect(page.locator("#event-payload")).to_contain_text(MARKUP)  # as text, not markup
            assert page.locator("#event-payload img").count() == 0
            enforcement = page.locator(f'#event-enforcements tr[data-id="{ids["enforcement"]}"]')
            expect(enforcement).to_contain_text("deploy-on-push")
            expect(enforcement.locator(".badge").first).to_have_text("requested")
            shot("event")

            enforcement.get_by_role("link", name=str(ids["execution"]), exact=True).click()
            expect(page).to_have_url(f"{base}/executions/{ids['execution']}")
            expect(page.locator("#execution-origin")).to_have_text(
                f"rule deploy-on-push (enforcement {ids['enforcement']}, event {ids['event']})"
            )
            expect(page.locator("#execution-status")).to_have_text("completed", timeout=30_000)
            shot("execution")

            page.get_by_role("link", name="Schedules", exact=True).click()
            expect(page).to_have_url(f"{base}/schedules")
            schedule = page.locator('#schedules tr[data-schedule="nightly-report"]')
            expect(schedule).to_contain_text("0 3 * * *")
            expect(schedule).to_contain_text("Europe/Paris")
            expect(schedule).to_contain_text("skip / latest")
            expect(schedule.locator("td.next-fire br")).to_have_count(2)  # three fire times
            shot("schedules")

            schedule.get_by_role("link", name="nightly-report").click()
            slot = page.locator("#schedule-slots tbody tr").first
            expect(slot).to_have_attribute("data-outcome", "requested")
            expect(slot.locator(".badge.s-completed")).to_have_text("completed", timeout=30_000)  # live
            shot("schedule")
            slot.get_by_role("link", name=str(ids["slotted"]), exact=True).click()
            expect(page.locator("#execution-origin")).to_contain_text("schedule nightly-report, slot ")
        except (AssertionError, PlaywrightError):
            shot("failure")
            raise
        finally:
            browser.close()

    assert problems == [], problems  # no script of the payload ran (no dialog), nothing failed to load
    assert len(shots) == 5
    done = eventually(lambda: db.execute("SELECT status FROM execution WHERE id = %s AND status = 'completed'",
                                         (ids["slotted"],)).fetchone(), timeout=30)  # fmt: skip
    assert done is not None
