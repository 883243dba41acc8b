"""Integration: the workflow commands of the CLI (in-process: ``conveyor.cli.main.main``,
errors as one line and exit code 1) and the SDK's methods, against the per-test database.
A workflow execution is started by a real scheduling round."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.cli.context import state
from conveyor.cli.main import main
from conveyor.domain.errors import ConflictError, InvalidWorkflowError, NotFoundError
from conveyor.sdk import Client
from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.builder import Workflow
from conveyor.workflows.registration import Definition
from conveyor.workflows.spec import TaskSpec, WorkflowSpec
from integration.builders import Conn, scheduler

SOURCE = """
ref: tests.two
description: two steps
tasks:
  one:
    action: core.noop
    next: [{when: <% succeeded() %>, do: two}]
  two:
    action: core.echo message=done
"""

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``conveyor ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("CONVEYOR_CONFIG", raising=False)
    monkeypatch.setattr(state, "_loaded", None)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["conveyor", *args])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def client(db_url: str) -> Any:
    with Client(db_url) as c:
        yield c


def test_register_list_get_delete(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(SOURCE)
    assert cli("workflows", "register", str(path)) == (0, "workflow tests.two registered: version 1\n", "")
    assert cli("workflows", "register", str(path))[1] == "workflow tests.two registered: version 2\n"
    code, out, _ = cli("workflows", "list", "--json")
    assert [(w["ref"], w["version"], w["versions"]) for w in json.loads(out)] == [("tests.two", 2, 2)]
    code, out, _ = cli("workflows", "get", "tests.two", "--version", "1")
    assert code == 0
    assert out.startswith("workflow tests.two  version 1 of 2\n"), out
    assert "  one  (core.noop)  start\n    when <% succeeded() %> -> two\n  two  (core.echo)\n" in out
    assert cli("workflows", "get", "tests.two", "--source")[1] == SOURCE
    assert cli("workflows", "delete", "tests.two") == (0, "workflow tests.two deleted (2 version(s))\n", "")
    code, out, err = cli("workflows", "delete", "tests.two")
    assert (code, out, err) == (1, "", "error: no workflow 'tests.two' (see `conveyor workflows list`)\n")


def test_registration_problems_are_listed_one_per_line(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tasks:\n  a:\n    action: nope.x\n    next: [{do: ghost}]\n")
    code, out, err = cli("workflows", "register", str(path), "--ref", "tests.bad")
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert lines[-1].startswith("nothing registered: ")
    assert all(ln.startswith(f"error: {path}: tasks.a.") for ln in lines[:-1]), err
    assert len(lines) >= 3, err  # the unknown action and the unknown task, at least
    assert cli("workflows", "register", str(tmp_path / "none.yaml"))[2].startswith("error: cannot read ")


async def test_executions_verbs_and_the_tree(
    cli: Cli, conn: Conn, pool: AsyncConnectionPool[Any], transport: PostgresTransport, tmp_path: Path
) -> None:
    (tmp_path / "two.yaml").write_text(SOURCE)
    assert cli("workflows", "register", str(tmp_path / "two.yaml"))[0] == 0
    code, out, _ = cli("run", "tests.two")
    eid = int(out)
    await scheduler(pool, transport).run_round()
    assert cli("executions", "pause", str(eid)) == (0, f"execution {eid} paused\n", "")
    assert cli("executions", "resume", str(eid)) == (0, f"execution {eid} running\n", "")
    code, out, err = cli("executions", "rerun", str(eid), "--from-failed")
    assert (code, out) == (1, "")
    assert err == f"error: workflow execution {eid} is running: only a failed or cancelled workflow can be rerun\n"
    code, out, _ = cli("executions", "get", str(eid))
    assert "workflow tests.two version 1  running" in out, out
    assert "(no task started yet)" in out, out
    code, out, _ = cli("executions", "cancel", str(eid), "--policy", "cancel_running")
    assert (code, out) == (0, f"execution {eid} canceling: its worker (or its workflow's children) stopping\n")
    plain = int(cli("run", "core.noop")[1])
    assert cli("executions", "pause", str(plain))[2] == (
        f"error: execution {plain} is requested: only a running workflow execution can pause\n"
    )
    assert json.loads(cli("executions", "get", str(plain), "--json")[1])["workflow"] is None


def test_the_sdk_registers_text_files_specs_and_builders(client: Client, tmp_path: Path) -> None:
    assert client.register_workflow(SOURCE) == {"ref": "tests.two", "version": 1}
    path = tmp_path / "two.yaml"
    path.write_text(SOURCE)
    assert client.register_workflow(path) == {"ref": "tests.two", "version": 2}
    spec = WorkflowSpec("tests.spec", tasks={"a": TaskSpec("a", "core.noop")})
    assert client.register_workflow(spec) == {"ref": "tests.spec", "version": 1}
    built = Workflow("tests.built", input=["who"])
    built.task("hi", action="core.echo", input={"message": "<% ctx(who) %>"})
    assert client.register_workflow(built) == {"ref": "tests.built", "version": 1}
    assert client.workflow("tests.built")["source"] == built.to_yaml()
    assert client.register_workflow("tasks: {a: {action: core.noop}}", ref="tests.named")["ref"] == "tests.named"
    got = client.workflow("tests.two")
    assert [v["version"] for v in got["versions"]] == [1, 2]
    assert got["graph"]["edges"] == [{"from": "one", "to": "two", "when": "<% succeeded() %>"}]
    assert [w["ref"] for w in client.workflows()] == ["tests.built", "tests.named", "tests.spec", "tests.two"]


def test_the_sdk_refuses_with_every_problem_and_the_database_refusals(client: Client) -> None:
    with pytest.raises(InvalidWorkflowError) as raised:
        client.register_workflow("ref: tests.bad\ntasks:\n  a:\n    action: nope.x\n")
    assert [(p[1], "nope.x" in p[2]) for p in raised.value.problems] == [("tasks.a.action", True)]
    with pytest.raises(ConflictError, match="runner type"):
        client.register_workflow("ref: core.noop\ntasks:\n  a:\n    action: core.echo message=x\n")
    with pytest.raises(NotFoundError):
        client.workflow("tests.none")
    with pytest.raises(NotFoundError):
        client.delete_workflow("tests.none")
    # Several definitions: all or none, and they may name each other.
    parent = "ref: tests.parent\ntasks:\n  a:\n    action: tests.child\n"
    child = "ref: tests.child\ntasks:\n  a:\n    action: core.noop\n"
    with pytest.raises(InvalidWorkflowError):
        client.register_workflows([*map(_text, (parent, child)), _text("ref: tests.x\ntasks: {a: {action: n.o}}")])
    assert client.workflows() == []
    registered = client.register_workflows([_text(parent), _text(child)])
    assert [r["ref"] for r in registered] == ["tests.parent", "tests.child"]


def _text(source: str) -> Definition:
    return Definition(text=source)
