"""Acceptance: a YAML workflow registered and run as a user would, against real processes
(``conveyor up``) and a real PostgreSQL: from the command line (``workflows register``,
``run REF --wait``, ``executions get`` with its task tree) and from the REST API
(``POST /api/v1/workflows``, ``POST /api/v1/executions``, ``/tree``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually

pytestmark = pytest.mark.acceptance

GREET = """
ref: demo.greet
description: Greet, then say goodbye
input:
  - name
  - greeting: hello
tasks:
  greet:
    action: core.echo message="<% ctx(greeting) %> <% ctx(name) %>"
    next:
      - when: <% succeeded() %>
        publish:
          - said: <% result() %>
        do: bye
  bye:
    action: core.echo
    input:
      message: "{{ ctx('name') }}, goodbye"
output:
  - said: <% ctx(said) %>
"""

FAN = """
ref: demo.fan
input: [names]
tasks:
  each:
    with:
      items: n in <% ctx(names) %>
      concurrency: 2
    action: core.echo message="hi <% item(n) %>"
    next:
      - when: <% succeeded() %>
        publish:
          - said: <% result() %>
output:
  - said: <% ctx(said) %>
"""

BROKEN = """
ref: demo.broken
tasks:
  first:
    action: nope.nothing
    next:
      - do: [missing]
"""


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return conveyor_env(db_url, CONVEYOR__API__PORT=port)


def test_register_and_run_from_the_command_line(procs: Procs, tmp_path: Path) -> None:
    procs.start("up", name="up").wait_for_log("Conveyor is up")
    (tmp_path / "greet.yaml").write_text(GREET)
    (tmp_path / "broken.yaml").write_text(BROKEN)

    refused = procs.run("workflows", "register", str(tmp_path / "greet.yaml"), str(tmp_path / "broken.yaml"))
    assert refused.returncode == 1, describe(refused)
    assert "Traceback" not in refused.stderr, describe(refused)
    problems = [ln for ln in refused.stderr.splitlines() if ln.startswith("error: ")]
    assert any("broken.yaml: tasks.first.action:" in ln for ln in problems), describe(refused)
    assert any("broken.yaml: tasks.first.next[0].do" in ln for ln in problems), describe(refused)
    assert "nothing registered" in refused.stderr
    assert procs.json("workflows", "list") == []  # all or nothing: greet.yaml was valid, and not registered

    registered = procs.run("workflows", "register", str(tmp_path / "greet.yaml"))
    assert registered.returncode == 0, describe(registered)
    assert registered.stdout.strip() == "workflow demo.greet registered: version 1"
    shown = procs.run("workflows", "get", "demo.greet")
    assert shown.returncode == 0, describe(shown)
    assert "greet  (core.echo)  start" in shown.stdout
    assert "when <% succeeded() %> -> bye" in shown.stdout, describe(shown)

    ran = procs.run("run", "demo.greet", "name=ada", "--wait", timeout=60)
    assert ran.returncode == 0, describe(ran)
    assert "completed" in ran.stdout, describe(ran)
    eid = int(ran.stdout.split()[1])
    execution = procs.json("executions", "get", str(eid))
    assert execution["status"] == "completed", execution
    assert execution["result"] == {"said": "hello ada"}, execution
    tasks = execution["workflow"]["tasks"]
    assert [(t["task"], t["status"]) for t in tasks] == [("greet", "succeeded"), ("bye", "succeeded")]
    bye = tasks[1]["children"][0]
    assert (bye["execution_status"], bye["result"]) == ("completed", '"ada, goodbye"'), bye

    text = procs.run("executions", "get", str(eid))
    assert text.returncode == 0, describe(text)
    assert "workflow demo.greet version 1  succeeded" in text.stdout, describe(text)
    assert '"ada, goodbye"' in text.stdout, describe(text)


def _token(procs: Procs) -> str:
    result = procs.run("tokens", "create", "--role", "operator")
    assert result.returncode == 0, describe(result)
    return result.stdout.splitlines()[-1]


def test_register_and_run_through_the_rest_api(procs: Procs) -> None:
    procs.start("up", name="up").wait_for_log("Conveyor is up")
    url = f"http://127.0.0.1:{procs.env['CONVEYOR__API__PORT']}"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {_token(procs)}"}, timeout=10) as client:
        refused = client.post("/api/v1/workflows", json={"source": BROKEN})
        assert refused.status_code == 422, refused.text
        assert {p["path"] for p in refused.json()["problems"]} >= {"tasks.first.action"}, refused.text

        created = client.post("/api/v1/workflows", json={"source": GREET})
        assert created.status_code == 201, created.text
        assert created.json()["graph"]["edges"] == [{"from": "greet", "to": "bye", "when": "<% succeeded() %>"}]

        requested = client.post("/api/v1/executions", json={"action_ref": "demo.greet", "parameters": {"name": "bo"}})
        assert requested.status_code == 201, requested.text
        eid = requested.json()["id"]

        def ended() -> dict[str, Any] | None:
            body: dict[str, Any] = client.get(f"/api/v1/executions/{eid}").json()
            return body if body["status"] in ("completed", "failed", "cancelled") else None

        execution = eventually(ended, timeout=30, interval=0.1, message=procs.logs)
        assert (execution["status"], execution["result"]) == ("completed", {"said": "hello bo"}), execution
        tree = client.get(f"/api/v1/executions/{eid}/tree").json()
        assert tree["status"] == "succeeded", json.dumps(tree)
        assert [(t["task"], t["status"]) for t in tree["tasks"]] == [("greet", "succeeded"), ("bye", "succeeded")]
        children = client.get(f"/api/v1/executions/{eid}/children").json()
        assert [c["action_ref"] for c in children] == ["core.echo", "core.echo"]
        assert [c["id"] for c in children] == [t["children"][0]["execution"] for t in tree["tasks"]]

        # `with` items: one child per item, results in item order.
        assert client.post("/api/v1/workflows", json={"source": FAN}).status_code == 201
        names = ["a", "b", "c"]
        body = {"action_ref": "demo.fan", "parameters": {"names": names}}
        eid = client.post("/api/v1/executions", json=body).json()["id"]
        execution = eventually(ended, timeout=30, interval=0.1, message=procs.logs)
        assert (execution["status"], execution["result"]) == ("completed", {"said": ["hi a", "hi b", "hi c"]})
        (each,) = client.get(f"/api/v1/executions/{eid}/tree").json()["tasks"]
        assert (each["items_total"], each["counts"]) == (3, {"succeeded": 3})
        assert [(c["index"], c["result"]) for c in each["children"]] == [(0, '"hi a"'), (1, '"hi b"'), (2, '"hi c"')]
