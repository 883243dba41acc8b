"""Acceptance: a 1,000-item ``with`` workflow registered from a YAML file with the CLI and
run with ``conveyor run REF --wait`` against real processes (``conveyor up``): it completes
with 1,000 results in item order, however the items' children finished."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from acceptance.helpers import Procs, conveyor_env, describe
from support.polling import eventually

pytestmark = pytest.mark.acceptance

THOUSAND = """
ref: demo.thousand
tasks:
  each:
    with:
      items: <% range(1000) %>
      concurrency: 100
    action: core.echo message="item <% item() %>"
    next:
      - when: <% succeeded() %>
        publish:
          - said: <% result() %>
output:
  - said: <% ctx(said) %>
"""


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return conveyor_env(db_url, CONVEYOR__API__PORT=port)


def test_a_thousand_items_from_the_command_line(procs: Procs, tmp_path: Path) -> None:
    procs.start("up", name="up").wait_for_log("Conveyor is up")
    (tmp_path / "thousand.yaml").write_text(THOUSAND)
    registered = procs.run("workflows", "register", str(tmp_path / "thousand.yaml"))
    assert registered.returncode == 0, describe(registered)

    began = time.monotonic()
    ran = procs.run("run", "demo.thousand", "--wait", timeout=120)
    took = time.monotonic() - began
    assert ran.returncode == 0, describe(ran)
    assert "completed" in ran.stdout, describe(ran)
    eid = int(ran.stdout.split()[1])

    execution = procs.json("executions", "get", str(eid), "--items", "1000")
    assert execution["status"] == "completed", execution["result"]
    assert execution["result"] == {"said": [f"item {n}" for n in range(1000)]}
    [task] = execution["workflow"]["tasks"]
    assert (task["task"], task["status"], task["items_total"]) == ("each", "succeeded", 1000), task
    # One child per item, each completed once (no retry needed, none run twice).
    assert sorted(c["index"] for c in task["children"]) == list(range(1000))
    assert {(c["execution_status"], c["retry"]) for c in task["children"]} == {("completed", 0)}
    print(f"1,000 items in {took:.1f} s")  # the figure, for whoever reads the test log


def _readme_example() -> str:
    """The workflow of README.md's "Workflows and inquiries" section, as written there."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    part = readme.split("### Workflows and inquiries", 1)[1]
    return part.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_readme_workflow_runs_as_the_readme_says(procs: Procs, tmp_path: Path) -> None:
    procs.start("up", name="up").wait_for_log("Conveyor is up")
    (tmp_path / "hello.yaml").write_text(_readme_example())
    registered = procs.run("workflows", "register", str(tmp_path / "hello.yaml"))
    assert registered.returncode == 0, describe(registered)
    ran = procs.run("run", "demo.hello", 'names=["ada","bo"]')
    assert ran.returncode == 0, describe(ran)
    eid = int(ran.stdout.strip())

    def asked() -> list[dict[str, object]] | None:
        rows: list[dict[str, object]] = procs.json("inquiries", "list")
        return rows or None

    [inquiry] = eventually(asked, timeout=60, interval=0.2, message=procs.logs)
    answered = procs.run("inquiries", "respond", str(inquiry["id"]), "--data", "{}")
    assert answered.returncode == 0, describe(answered)

    def done() -> dict[str, object] | None:
        execution: dict[str, object] = procs.json("executions", "get", str(eid))
        return execution if execution["status"] in ("completed", "failed") else None

    execution = eventually(done, timeout=60, interval=0.2, message=procs.logs)
    assert execution["status"] == "completed", execution
    assert execution["result"] == {"said": ["hello ada", "hello bo"], "approved": {}}
