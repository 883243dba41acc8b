"""Acceptance: a workflow execution's graph in the dashboard, in a real headless Chromium
(as test_dashboard.py drives it) against real ``executor``, ``worker`` and ``api``
processes. The workflow fans out to two builds and an approval (``core.ask``), joins them
(``join: all``) and publishes: while the inquiry is pending the graph shows some tasks
succeeded, the approval pending (waiting for its answer), the join waiting and the last task not started -- each
as the database says; once the inquiry is answered from the CLI the same page, not
reloaded, shows every task succeeded and the execution completed. Screenshots of both
go to ``$CONVEYOR_TEST_ARTIFACTS/workflow-graph`` (default ``test-artifacts/``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually
from acceptance.test_dashboard import ARTIFACTS, CHROMIUM, Db, _start_api, _unavailable

pytestmark = pytest.mark.acceptance

# Names of several lengths: one longer than a box holds (cut, with its whole name as tooltip).
RELEASE = """
ref: graph.release
description: Build on two systems and ask for approval, then package and publish
tasks:
  checkout:
    action: core.echo message=checkout
    next:
      - when: <% succeeded() %>
        do: build_linux, build_windows_and_macos_together, approve
  build_linux:
    action: core.echo message=linux
    next:
      - when: <% succeeded() %>
        do: package
  build_windows_and_macos_together:
    action: core.echo message=windows
    next:
      - when: <% succeeded() %>
        do: package
  approve:
    action: core.ask
    input:
      prompt: Publish the release?
      schema: {type: object, properties: {ship: {type: boolean}}, required: [ship]}
    next:
      - when: <% succeeded() and result().response.ship %>
        do: package
  package:
    join: all
    action: core.echo message=package
    next:
      - when: <% succeeded() %>
        do: publish
  publish:
    action: core.echo message=publish
"""
TASKS = ["checkout", "build_linux", "build_windows_and_macos_together", "approve", "package", "publish"]
WAITING = {"checkout": "succeeded", "build_linux": "succeeded", "build_windows_and_macos_together": "succeeded",
           "approve": "pending", "package": "waiting", "publish": "none"}  # fmt: skip


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, CONVEYOR_USER="releaser")


@pytest.fixture
def artifacts() -> Path:
    # Its own folder: test_dashboard.py's fixture empties "dashboard" at each of its tests.
    folder = Path(os.environ.get("CONVEYOR_TEST_ARTIFACTS") or ARTIFACTS) / "workflow-graph"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _task_states(db: Db, eid: int) -> dict[str, str]:
    """Each task's latest instance's status, "none" for a task not entered: what the graph
    must show, read from the database alone."""
    rows = db.execute(
        # A running task whose current child waits for an answer is shown pending.
        "SELECT DISTINCT ON (t.task_name) t.task_name, CASE WHEN t.status = 'running' AND EXISTS ("
        " SELECT 1 FROM workflow_task_dispatch d JOIN execution e ON e.id = d.execution"
        " WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name"
        " AND d.iteration = t.iteration AND e.status = 'pending') THEN 'pending' ELSE t.status END AS status"
        " FROM workflow_task t"
        " JOIN workflow_execution w ON w.id = t.workflow_execution WHERE w.execution = %s"
        " ORDER BY t.task_name, t.iteration DESC",
        (eid,),
    ).fetchall()
    found = {r["task_name"]: r["status"] for r in rows}
    return {name: found.get(name, "none") for name in TASKS}


def _drawn(page: Any) -> dict[str, Any]:
    """The graph as Chromium laid it out: each task's state and class, its box on the
    screen, its label's box and whether the label's text is cut."""
    return dict(
        page.evaluate("""() => {
        const nodes = {};
        for (const g of document.querySelectorAll("#workflow-graph g.wf-task")) {
            const box = g.querySelector("rect").getBoundingClientRect();
            const name = g.querySelector(".wf-name");
            const label = name.getBoundingClientRect();
            nodes[g.dataset.task] = {
                state: g.dataset.state, cls: g.getAttribute("class"), text: name.textContent,
                box: [box.left, box.top, box.right, box.bottom], label: [label.left, label.right],
            };
        }
        const edges = [...document.querySelectorAll("#workflow-graph path.wf-edge")].map(
            (p) => [p.dataset.from, p.dataset.to, p.getTotalLength()]);
        return {nodes, edges};
    }""")
    )


def _check_geometry(drawn: dict[str, Any]) -> None:
    """Readable: no two boxes overlap, every label fits inside its box, every edge drawn."""
    boxes = {name: n["box"] for name, n in drawn["nodes"].items()}
    for a, b in [(a, b) for a in boxes for b in boxes if a < b]:
        (l1, t1, r1, b1), (l2, t2, r2, b2) = boxes[a], boxes[b]
        assert r1 <= l2 or r2 <= l1 or b1 <= t2 or b2 <= t1, f"{a} overlaps {b}: {boxes[a]} {boxes[b]}"
    for name, n in drawn["nodes"].items():
        left, right = n["label"]
        assert n["box"][0] + 2 <= left, f"the label of {name} leaves its box: {n}"
        assert right <= n["box"][2] - 2, f"the label of {name} leaves its box: {n}"
    expected = {("checkout", "build_linux"), ("checkout", "build_windows_and_macos_together"),
                ("checkout", "approve"), ("build_linux", "package"), ("build_windows_and_macos_together", "package"),
                ("approve", "package"), ("package", "publish")}  # fmt: skip
    assert {(s, t) for s, t, _ in drawn["edges"]} == expected
    assert all(length > 10 for _, _, length in drawn["edges"]), drawn["edges"]


def test_in_chromium_the_graph_shows_live_task_states(procs: Procs, db: Db, artifacts: Path, tmp_path: Path) -> None:
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
    created = procs.run("tokens", "create", "--role", "viewer", "--name", "watcher")
    assert created.returncode == 0, describe(created)
    token = created.stdout.strip().splitlines()[-1]
    (tmp_path / "release.yaml").write_text(RELEASE)
    registered = procs.run("workflows", "register", str(tmp_path / "release.yaml"))
    assert registered.returncode == 0, describe(registered)
    ran = procs.run("run", "graph.release")
    assert ran.returncode == 0, describe(ran)
    eid = int(ran.stdout)
    # The three other branches end while the approval waits: the join has two of its arrivals.
    eventually(lambda: _task_states(db, eid) == WAITING, timeout=30, message=lambda: f"{_task_states(db, eid)}\n"
               f"{procs.logs()}")  # fmt: skip
    inquiry = db.execute(
        "SELECT i.id FROM inquiry i JOIN execution e ON e.id = i.execution WHERE e.parent = %s", (eid,)
    ).fetchone()
    assert inquiry is not None

    shots: list[Path] = []
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))

        def shot(name: str, only: Any = None) -> None:
            path = artifacts / f"graph-{len(shots) + 1:02d}-{name}.png"
            (only or page).screenshot(path=str(path), **({} if only else {"full_page": True}))
            shots.append(path)
            print(f"screenshot: {path}")

        try:
            page.goto(f"{base}/login?next=/executions/{eid}")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{base}/executions/{eid}")
            page.evaluate("window.notReloaded = true")
            graph = page.locator("#workflow-graph")
            expect(graph).to_be_visible()
            expect(graph.locator("g.wf-task")).to_have_count(len(TASKS))
            expect(page.locator("#workflow-status")).to_have_text("running")
            expect(page.locator("#execution-status")).to_have_text("running")
            before = _drawn(page)
            shot("waiting-for-approval")
            shot("waiting-graph", page.locator(".graph-box"))  # the graph alone, at full size

            assert sorted(before["nodes"]) == sorted(TASKS)
            assert {n: v["state"] for n, v in before["nodes"].items()} == _task_states(db, eid) == WAITING
            for name, node in before["nodes"].items():
                assert node["cls"] == f"wf-task g-{WAITING[name]}", (name, node)
            cut = before["nodes"]["build_windows_and_macos_together"]["text"]  # too long: cut, and it fits
            assert cut.endswith("…"), cut
            assert "build_windows_and_macos_together".startswith(cut[:-1]), cut
            expect(graph.locator('g[data-task="approve"] .wf-note')).to_have_text("pending")
            expect(graph.locator('g[data-task="publish"] .wf-note')).to_have_text("not started")
            _check_geometry(before)

            answered = procs.run("inquiries", "respond", str(inquiry["id"]), "--data", json.dumps({"ship": True}))
            assert answered.returncode == 0, describe(answered)
            # Live: the poll patches the graph in place.
            expect(page.locator("#execution-status")).to_have_text("completed", timeout=30_000)
            for name in TASKS:
                expect(graph.locator(f'g.wf-task[data-task="{name}"]')).to_have_class("wf-task g-succeeded")
            expect(page.locator("#workflow-status")).to_have_text("succeeded")
            expect(page.locator("#live-status")).to_contain_text("final")
            assert page.evaluate("window.notReloaded") is True, "the page was reloaded"
            after = _drawn(page)
            shot("completed")
            # What the poll patched in is what a fresh page shows.
            patched = page.locator("[data-live]").inner_text()
            page.reload()
            expect(page.locator("#execution-status")).to_have_text("completed")
            assert page.locator("[data-live]").inner_text() == patched
        except (AssertionError, PlaywrightError):
            shot("failure")
            raise
        finally:
            browser.close()

    assert set(_task_states(db, eid).values()) == {"succeeded"}
    assert after["nodes"].keys() == before["nodes"].keys()
    assert [n["box"] for n in after["nodes"].values()] == [n["box"] for n in before["nodes"].values()]
    _check_geometry(after)
    status = db.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone()
    assert status is not None
    assert status["status"] == "completed"
    expected = "console: Failed to load resource: the server responded with a status of 4"
    assert [p for p in problems if not p.startswith(expected)] == [], problems
    assert len(shots) == 3
    assert all(p.stat().st_size > 0 for p in shots)
