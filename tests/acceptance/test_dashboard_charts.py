"""Acceptance: the charts page and ``/docs`` served by a real ``conveyor api`` process.

Every page links only to this server (no CDN: the dashboard and Swagger UI work offline),
the charts draw what ran (in Chromium, live, without a reload), and ``/docs`` renders the
API's operations with the browser allowed to reach nothing but the server. Screenshots go
to ``$CONVEYOR_TEST_ARTIFACTS/charts`` (default ``test-artifacts/charts``)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import psycopg
import pytest

from acceptance.browser_kit import CHROMIUM, require_browser, screenshots, start_api
from acceptance.helpers import Procs, conveyor_env, eventually
from acceptance.test_dashboard import _sql_token
from conveyor.domain.tokens import Role

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


class Links(HTMLParser):
    """Every URL a page makes the browser fetch or offers to follow."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href", "action") and value]


def links(html: str) -> list[str]:
    parser = Links()
    parser.feed(html)
    return parser.urls


def test_every_page_and_asset_comes_from_this_server(procs: Procs, db: Db) -> None:
    base = start_api(procs)
    token = _sql_token(db, Role.admin)
    with httpx.Client(base_url=base, cookies={"conveyor_token": token}, timeout=10) as site:
        home = site.get("/")
        assert home.status_code == 200, home.text
        nav = [u for u in links(home.text) if u.startswith("/") and not u.startswith(("/static/", "/logout"))]
        assert "/charts" in nav
        pages = sorted({*nav, "/login", "/docs", "/charts"})
        assets: set[str] = set()
        for path in pages:
            response = site.get(path)
            assert response.status_code == 200, (path, response.status_code)
            for url in links(response.text):
                absolute = urljoin(f"{base}{path}", url)
                if url.startswith("data:"):
                    continue
                assert urlsplit(absolute).netloc == urlsplit(base).netloc, f"{path} refers to {url}"
                if "/static/" in absolute or "/docs/assets/" in absolute:
                    parts = urlsplit(absolute)
                    assets.add(f"{parts.path}?{parts.query}" if parts.query else parts.path)
            # No URL hidden in inline code either (Swagger UI's set-up); an SVG's xmlns names
            # a namespace, nothing is fetched from it.
            text = re.sub(r'xmlns="http://www\.w3\.org/2000/svg"', "", response.text)
            assert not re.search(r"https?://", text), (path, re.findall(r"https?://\S{0,40}", text))
        assert {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"} <= {a.split("?")[0] for a in assets}
        types = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
        for asset in assets:
            response = site.get(asset)
            assert response.status_code == 200, asset
            suffix = asset.split("?")[0][asset.split("?")[0].rfind(".") :]
            assert response.headers["content-type"].startswith(types[suffix]), (asset, response.headers)
            assert "max-age" in response.headers["cache-control"], asset
        assert site.get("/docs/assets/../../etc/passwd").status_code == 404
        assert site.get("/docs/assets/index.html").status_code == 404
        # /docs' policy lets its own inline set-up run (by hash) and nothing from elsewhere.
        docs = site.get("/docs")
        policy = docs.headers["content-security-policy"]
        assert re.search(r"script-src 'self' 'sha256-[A-Za-z0-9+/=]+'; ", policy), policy
        assert "default-src 'none'" in policy
        assert site.get("/api/v1/openapi.json").status_code == 200


@pytest.fixture
def artifacts() -> Path:
    return screenshots("charts")


_SUM = "(s) => [...document.querySelectorAll(s)].reduce((n, e) => n + Number(e.dataset.value), 0)"


def _sum(page: Any, selector: str) -> float:
    """What the marks matching ``selector`` add up to (each carries its number)."""
    return float(page.evaluate(_SUM, selector))


def test_in_chromium_charts_draw_what_ran_and_docs_work_offline(procs: Procs, db: Db, artifacts: Path) -> None:
    require_browser()
    from playwright.sync_api import Route, expect, sync_playwright

    procs.start("executor", name="executor")
    procs.start("worker", "--name", "w1", name="w1")
    base = start_api(procs)
    token = _sql_token(db, Role.admin)
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def request(action: str, parameters: dict[str, Any], **extra: Any) -> int:
        response = api.post("/api/v1/executions", json={"action_ref": action, "parameters": parameters, **extra})
        assert response.status_code in (200, 201, 202), response.text
        return int(response.json()["id"])

    ids = [request("core.echo", {"message": f"chart {i}"}) for i in range(3)]
    ids.append(request("core.local", {"cmd": "exit 3"}))
    for _ in range(2):
        request("core.sleep", {"seconds": 1}, delay="1h")  # requested (waiting), for an hour

    def finished() -> dict[str, str]:
        rows = db.execute("SELECT id, status FROM execution WHERE id = ANY(%s)", (ids,)).fetchall()
        done = {r["id"]: r["status"] for r in rows if r["status"] in ("completed", "failed")}
        return {str(k): v for k, v in done.items()} if len(done) == len(ids) else {}

    statuses = eventually(finished, timeout=60, message=procs.logs)
    assert sorted(statuses.values()) == ["completed", "completed", "completed", "failed"], statuses

    host = urlsplit(base).netloc
    shots: list[Path] = []
    problems: list[str] = []
    elsewhere: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 900})

        def only_the_server(route: Route) -> None:
            # The network is the server and nothing else: a CDN request fails and is noted.
            if urlsplit(route.request.url).netloc == host or route.request.url.startswith("data:"):
                route.continue_()
            else:
                elsewhere.append(route.request.url)
                route.abort()

        context.route("**/*", only_the_server)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))

        def shot(name: str, full_page: bool = True) -> None:
            path = artifacts / f"{len(shots) + 1:02d}-{name}.png"
            page.screenshot(path=str(path), full_page=full_page)
            shots.append(path)
            print(f"screenshot: {path}")

        try:
            page.goto(f"{base}/login?next=%2Fcharts")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/charts")
            page.evaluate("window.notReloaded = true")
            for key in ("throughput", "failures", "latency", "queue"):
                expect(page.locator(f"#chart-{key} svg[role=img]")).to_be_visible()
            assert _sum(page, "#chart-throughput rect.bar-completed") == 3
            assert _sum(page, "#chart-throughput rect.bar-failed") == 1
            assert _sum(page, "#chart-failures rect.bar-failed") == 1
            assert page.locator("#chart-latency circle.dot-p50").count() >= 1
            queue = page.locator('#chart-queue rect.bar-requested[data-label="core.sleep"]')
            expect(queue).to_have_attribute("data-value", "2")
            expect(page.locator("#charts-completed")).to_have_text("3")
            shot("charts")

            # Open a chart's numbers: the table says the same, and stays open while the page updates.
            page.click("#chart-throughput summary")
            numbers = page.locator("#chart-throughput table")
            expect(numbers).to_be_visible()
            shot("charts-numbers")

            # Live: one more run shows up without a reload.
            ids.append(request("core.echo", {"message": "one more"}))
            expect(page.locator("#charts-completed")).to_have_text("4", timeout=30_000)
            eventually(lambda: _sum(page, "#chart-throughput rect.bar-completed") == 4, timeout=10)
            assert page.evaluate("window.notReloaded") is True
            expect(numbers).to_be_visible()  # the reader's open <details> survived the refreshes
            shot("charts-live")

            # Swagger UI, every file from the server: it renders the API's operations.
            page.goto(f"{base}/docs")
            expect(
                page.locator(".opblock-summary-path", has_text=re.compile(r"^/api/v1/executions$")).first
            ).to_be_visible(timeout=30_000)
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("Conveyor")
            shot("docs", full_page=False)  # the whole API is 10,000 pixels tall
        except Exception:
            shot("failure")
            raise
        finally:
            browser.close()
            api.close()
    assert not elsewhere, f"requests to other hosts: {elsewhere}"
    assert not problems, problems
