"""Acceptance: the dashboard served by a real ``conveyor api`` process.

The browser test drives it in a real headless Chromium (Debian's ``chromium``, through
Playwright) against real ``executor``, ``worker`` and ``api`` processes: sign in with a
token, request an execution with the form, watch it complete without reloading, read its
detail, cordon the worker, and see the API's refusal once the token is revoked. Its
screenshots go to ``$CONVEYOR_TEST_ARTIFACTS/dashboard`` (default: ``test-artifacts/dashboard`` in
the repository, git-ignored), where they stay after the run.

The HTTP tests check what a browser cannot show cheaply: redirects to the sign-in form,
the cookie's attributes, roles, escaping of user data, and the custom header the API
requires of state changes authenticated by the cookie (bearer clients unaffected)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from acceptance.browser_kit import ARTIFACTS, CHROMIUM
from acceptance.browser_kit import start_api as _start_api
from acceptance.browser_kit import unavailable as _unavailable
from acceptance.helpers import Procs, conveyor_env, describe, eventually
from conveyor.domain.tokens import Role, token_row
from conveyor.store.queries import Q

pytestmark = pytest.mark.acceptance

DASHBOARD_HEADER = {"X-Conveyor-Dashboard": "1"}
Db = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _sql_token(db: Db, role: Role) -> str:
    token, params = token_row(f"test {role.name}", role)
    db.execute(Q["create_token"], params)
    return token


def _cordoned(db: Db, name: str) -> bool | None:
    row = db.execute("SELECT cordoned FROM worker WHERE name = %s", (name,)).fetchone()
    return None if row is None else bool(row["cordoned"])


@pytest.fixture
def site(procs: Procs) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=_start_api(procs), follow_redirects=False, timeout=10) as client:
        yield client


def _signed_in(site: httpx.Client, token: str) -> httpx.Client:
    return httpx.Client(base_url=site.base_url, cookies={"conveyor_token": token}, follow_redirects=False, timeout=10)


# -- plain HTTP ----------------------------------------------------------------------------


def test_pages_send_strangers_to_sign_in_and_sign_in_sets_a_strict_cookie(site: httpx.Client, db: Db) -> None:
    for path in ["/", "/executions", "/executions?status=running&action=core.echo", "/executions/1", "/workers",
                 "/dead-letters"]:  # fmt: skip
        response = site.get(path)
        assert response.status_code == 303, (path, response.text)
        assert response.headers["location"] == f"/login?next={quote(path, safe='')}"
    assert site.get("/_live/workers").status_code == 401  # the page's script says "signed out"

    form = site.get("/login?next=/workers")
    assert form.status_code == 200
    assert 'name="token"' in form.text
    assert 'name="next" value="/workers"' in form.text
    assert "script-src 'self'" in form.headers["content-security-policy"]

    refused = site.post("/login", data={"token": "cvy_not-a-token", "next": "/workers"})
    assert refused.status_code == 401
    assert "invalid or revoked token" in refused.text
    assert "set-cookie" not in refused.headers

    viewer = _sql_token(db, Role.viewer)
    accepted = site.post("/login", data={"token": viewer, "next": "/workers"})
    assert accepted.status_code == 303
    assert accepted.headers["location"] == "/workers"
    cookie = accepted.headers["set-cookie"]
    assert cookie.startswith(f"conveyor_token={viewer};")
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= attributes, cookie

    # Only a path on this site is a place to go after signing in.
    for target in ["//evil.example/x", "https://evil.example/", "/\\evil.example"]:
        response = site.post("/login", data={"token": viewer, "next": target})
        assert response.headers["location"] == "/", target

    with _signed_in(site, viewer) as browser:
        assert browser.get("/workers").status_code == 200
        assert browser.get("/_live/workers").status_code == 200
    out = site.get("/logout")
    assert out.status_code == 303
    assert out.headers["location"] == "/login"
    assert out.headers["set-cookie"].startswith('conveyor_token="";')
    assert "max-age=0" in out.headers["set-cookie"].lower()


def test_roles_escaping_and_the_header_cookie_changes_need(site: httpx.Client, db: Db) -> None:
    tokens = {role: _sql_token(db, role) for role in Role}
    name = "ghost<&>"  # stale: active, no heartbeat for an hour (no executor runs to sweep it)
    db.execute("INSERT INTO worker (name, status, last_heartbeat) VALUES (%s, 'active', now() - interval '1 hour')",
               (name,))  # fmt: skip
    cordon = f"/api/v1/workers/{quote(name, safe='')}/cordon"
    request = {"action_ref": "core.echo", "parameters": {"message": "<script>alert(1)</script>"}}

    with _signed_in(site, tokens[Role.viewer]) as viewer:
        page = viewer.get("/executions").text
        assert "<fieldset disabled>" in page
        assert "Requesting needs the operator role" in page
        page = viewer.get("/workers").text
        assert "data-worker-action" not in page
        assert "need the admin role" in page
        assert "ghost&lt;&amp;&gt;" in page
        assert name not in page
        refused = viewer.post(cordon, headers=DASHBOARD_HEADER)
        assert refused.status_code == 403
        assert "admin role" in refused.json()["error"]

    with _signed_in(site, tokens[Role.operator]) as operator:
        assert "<fieldset>" in operator.get("/executions").text
        # A cookie alone is not enough to change anything: the dashboard's header is required...
        refused = operator.post("/api/v1/executions", json=request)
        assert refused.status_code == 403
        assert "X-Conveyor-Dashboard" in refused.json()["error"]
        # ... even when the body is sent as a form (the API reads every body as JSON).
        refused = operator.post("/api/v1/executions", content=json.dumps(request).encode(),
                                headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert refused.status_code == 403
        assert operator.get("/api/v1/executions").status_code == 200  # reads need no header
        created = operator.post("/api/v1/executions", json=request, headers=DASHBOARD_HEADER)
        assert created.status_code == 201, created.text
        eid = created.json()["id"]
        # User data is escaped wherever the dashboard shows it.
        for path in [f"/executions/{eid}", f"/_live/executions/{eid}"]:
            page = operator.get(path).text
            assert "<script>alert(1)</script>" not in page
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert operator.get("/executions/999999").status_code == 404
        assert operator.get("/executions/abc").status_code == 404

    # Bearer clients are unaffected: no header needed, whatever cookie comes along.
    bearer = {"Authorization": f"Bearer {tokens[Role.operator]}"}
    assert site.post("/api/v1/executions", json=request, headers=bearer).status_code == 201
    site.cookies.set("conveyor_token", tokens[Role.viewer])
    assert site.post("/api/v1/executions", json=request, headers=bearer).status_code == 201
    site.cookies.clear()

    with _signed_in(site, tokens[Role.admin]) as admin:
        page = admin.get("/workers").text
        assert 'data-worker-action="cordon"' in page
        assert 'data-stale="true"' in page
        assert admin.post(cordon).status_code == 403
        assert _cordoned(db, name) is False
        done = admin.post(cordon, headers=DASHBOARD_HEADER)
        assert done.status_code == 200, done.text
        assert _cordoned(db, name) is True
        assert 'data-cordoned="true"' in admin.get("/_live/workers").text


def _dead_letter(db: Db, n: int, reason: str, error: str | None) -> int:
    row = db.execute(Q["record_dead_letter"], {
        "dedupe_key": f"test-{n}", "message_id": f"m{n}", "transport": "rabbitmq", "reason": reason,
        "queue": "conveyor.worker.7.executions", "exchange": "conveyor.dlx", "routing_key": "worker.7",
        "message_type": "execution.scheduled", "payload": Jsonb({"n": n}), "headers": Jsonb({}), "execution": None,
        "attempt": None, "worker": None, "error": error,
    }).fetchone()  # fmt: skip
    assert row is not None
    return int(row["id"])


def test_dead_letters_page_lists_filters_and_escapes(site: httpx.Client, db: Db) -> None:
    expired = _dead_letter(db, 1, "expired", None)
    invalid = _dead_letter(db, 2, "rejected", "not JSON: <b>oops</b>")
    with _signed_in(site, _sql_token(db, Role.viewer)) as viewer:
        page = viewer.get("/dead-letters")
        assert page.status_code == 200
        for path in ["/dead-letters", "/_live/dead-letters"]:
            text = viewer.get(path).text
            assert f'data-id="{expired}"' in text
            assert f'data-id="{invalid}"' in text
            assert '<span id="dead-letters-pending">2</span> pending' in text
            assert "<b>oops</b>" not in text
            assert "not JSON: &lt;b&gt;oops&lt;/b&gt;" in text
        only = viewer.get("/_live/dead-letters?reason=rejected").text
        assert f'data-id="{invalid}"' in only
        assert f'data-id="{expired}"' not in only
        bogus = viewer.get("/dead-letters?reason=bogus")
        assert bogus.status_code == 200
        assert "unknown reason" in bogus.text


# -- a real browser -------------------------------------------------------------------------


@pytest.fixture
def artifacts() -> Path:
    folder = Path(os.environ.get("CONVEYOR_TEST_ARTIFACTS") or ARTIFACTS) / "dashboard"
    shutil.rmtree(folder, ignore_errors=True)  # this run's screenshots only
    folder.mkdir(parents=True)
    return folder


def test_in_chromium_request_watch_and_cordon(procs: Procs, db: Db, artifacts: Path) -> None:
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
    created = procs.run("tokens", "create", "--role", "admin", "--name", "dashboard test")
    assert created.returncode == 0, describe(created)
    token = created.stdout.strip().splitlines()[-1]
    token_id = re.search(r"token (\d+) \(", created.stderr)
    assert token_id, describe(created)
    eventually(lambda: db.execute("SELECT 1 FROM worker WHERE name = 'w1' AND status = 'active'").fetchone(),
               timeout=30, message=procs.logs)  # fmt: skip

    shots: list[Path] = []
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))

        def shot(name: str) -> None:
            path = artifacts / f"{len(shots) + 1:02d}-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)
            print(f"screenshot: {path}")

        try:
            # Sign in: a stranger is sent to the form, and back where they wanted to go.
            page.goto(f"{base}/executions")
            expect(page).to_have_url(f"{base}/login?next=%2Fexecutions")
            page.fill("#token", "cvy_wrong")
            page.click("button[type=submit]")
            expect(page.locator("#login-error")).to_have_text("invalid or revoked token")
            page.fill("#token", token)
            shot("sign-in")
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/executions")
            expect(page.locator("#role")).to_have_text("admin")
            page.evaluate("window.notReloaded = true")

            # Request core.echo with the form; a refusal shows the API's own words.
            page.select_option("#request-action", "core.echo")
            page.fill("#request-parameters", '{"message": 42}')
            page.click("#request-submit")
            message = page.locator("#request-message")
            expect(message).to_have_attribute("data-state", "error")
            expect(message).to_contain_text("HTTP 422")
            refusal = message.inner_text()
            page.fill("#request-parameters", '{"message": "hello from chromium"}')
            page.click("#request-submit")
            expect(message).to_have_attribute("data-state", "ok")
            eid = int(message.get_attribute("data-execution-id") or 0)
            assert eid > 0, message.inner_text()

            # Watch it complete: the row was not on the page when it was rendered.
            row = page.locator(f'#executions tr[data-id="{eid}"]')
            expect(row).to_have_attribute("data-status", "completed", timeout=30_000)
            expect(row.locator("td").nth(3)).to_have_text("w1")
            assert page.evaluate("window.notReloaded") is True, "the page was reloaded"
            expect(page.locator("#live-status")).to_contain_text("live")
            shot("executions-completed")

            # Its detail: parameters, output, the attempt on w1.
            row.locator("a").first.click()
            expect(page).to_have_url(f"{base}/executions/{eid}")
            expect(page.locator("#execution-status")).to_have_text("completed")
            expect(page.locator("#execution-parameters")).to_contain_text("hello from chromium")
            expect(page.locator("#execution-data")).to_contain_text("hello from chromium")
            attempt = page.locator('#attempts tr[data-attempt="1"]')
            expect(attempt.locator("td.worker")).to_have_text("w1")
            expect(attempt).to_contain_text("completed")
            shot("execution-detail")

            # The overview counts it.
            page.click("nav >> text=Overview")
            expect(page.locator('#status-counts tr[data-status="completed"] td.num')).to_have_text("1")
            expect(page.locator("#throughput")).to_have_text("1")
            expect(page.locator("#workers-active")).to_have_text("1")
            shot("overview")

            # A dead letter recorded meanwhile appears on its page without a reload.
            page.click("nav >> text=Dead letters")
            expect(page.locator("#dead-letters-pending")).to_have_text("0")
            letter = _dead_letter(db, 1, "expired", None)
            expect(page.locator(f'#dead-letters tr[data-id="{letter}"]')).to_contain_text("expired")
            expect(page.locator("#dead-letters-pending")).to_have_text("1")
            shot("dead-letters")

            # Cordon w1 from the workers page; the database says so.
            page.click("nav >> text=Workers")
            worker = page.locator('#workers tr[data-worker="w1"]')
            expect(worker).to_have_attribute("data-cordoned", "false")
            worker.locator('button[data-worker-action="cordon"]').click()
            expect(page.locator("#worker-message")).to_have_text("w1: cordoned (active).")
            expect(worker).to_have_attribute("data-cordoned", "true")
            expect(worker.locator('button[data-worker-action="uncordon"]')).to_be_visible()
            assert _cordoned(db, "w1") is True
            shot("worker-cordoned")

            # Revoke the token: the page says it is signed out, and the API's refusal is shown.
            revoked = procs.run("tokens", "revoke", token_id.group(1))
            assert revoked.returncode == 0, describe(revoked)
            expect(page.locator("#live-status")).to_contain_text("signed out", timeout=20_000)
            worker.locator('button[data-worker-action="uncordon"]').click()
            expect(page.locator("#worker-message")).to_have_text(
                "uncordon w1 refused: invalid or revoked token (HTTP 401)"
            )
            assert _cordoned(db, "w1") is True
            shot("refused-after-revoke")
        except (AssertionError, PlaywrightError):
            shot("failure")
            raise
        finally:
            browser.close()

    assert refusal == "Refused: invalid parameters for core.echo: message: 42 is not of type 'string' (HTTP 422)"
    # Chromium logs every 4xx response (the wrong token, the refusals above, the revoked
    # token's polls); anything else logged as an error (a CSP violation, a script error) is a bug.
    expected = "console: Failed to load resource: the server responded with a status of 4"
    assert [p for p in problems if not p.startswith(expected)] == [], problems
    assert len(shots) == 7
    assert all(p.stat().st_size > 0 for p in shots)
