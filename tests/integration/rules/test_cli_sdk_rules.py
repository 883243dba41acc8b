"""``conveyor rules ...`` and the SDK's rule methods against the per-test database, and a
rule whose action is a workflow."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.cli.context import state as cli_state
from conveyor.cli.main import main
from conveyor.domain.errors import InvalidRuleError, NotFoundError
from conveyor.sdk import Client
from integration.builders import Conn, Pool
from integration.rules.kit import action, emit, enforcements, run_pass, trigger
from integration.workflows.kit import start, state

Cli = Callable[..., tuple[int, str, str]]
RULE = """
ref: ci.on_push
trigger: test.push
criteria: {trigger.branch: {type: equals, pattern: main}}
action: {ref: test.echo, parameters: {msg: "{{ trigger.branch }}"}}
"""


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("CONVEYOR_CONFIG", raising=False)
    monkeypatch.setattr(cli_state, "_loaded", None)

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
def client(db_url: str) -> Iterator[Client]:
    with Client(db_url) as c:
        yield c


def test_cli_register_list_get_disable_enable_delete(cli: Cli, conn: Conn, tmp_path: Path) -> None:
    action(conn)
    trigger(conn)
    path = tmp_path / "rule.yaml"
    path.write_text(RULE)
    assert cli("rules", "register", str(path)) == (0, "rule ci.on_push registered\n", "")
    assert cli("rules", "register", str(path)) == (0, "rule ci.on_push updated\n", "")
    code, out, _ = cli("rules", "list")
    assert code == 0
    assert "ci.on_push" in out
    assert "test.push" in out
    code, out, _ = cli("rules", "get", "ci.on_push")
    assert code == 0
    assert "trigger: test.push" in out
    assert cli("rules", "disable", "ci.on_push") == (0, "rule ci.on_push disabled\n", "")
    assert cli("rules", "enable", "ci.on_push") == (0, "rule ci.on_push enabled\n", "")
    assert cli("rules", "delete", "ci.on_push") == (0, "rule ci.on_push deleted\n", "")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("rules", "get", "nope"), "no rule 'nope'"),
        (("rules", "delete", "nope"), "no rule 'nope'"),
        (("rules", "enable", "nope"), "no rule 'nope'"),
        (("rules", "register", "/nonexistent.yaml"), "cannot read /nonexistent.yaml"),
    ],
)
def test_cli_errors_are_one_line(cli: Cli, args: tuple[str, ...], needle: str) -> None:
    code, out, err = cli(*args)
    assert code != 0
    assert out == ""
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_cli_invalid_rule_lists_every_problem(cli: Cli, conn: Conn, tmp_path: Path) -> None:
    trigger(conn)
    bad = tmp_path / "bad.yaml"
    bad.write_text("ref: x.y\ntrigger: test.push\ncriteria: {trigger.a: {type: nope}}\naction: {ref: a.b, z: 1}\n")
    code, out, err = cli("rules", "register", str(bad))
    assert code == 1
    assert out == ""
    assert err.splitlines() == [f"error: {bad}: criteria.trigger.a.type: unknown operator 'nope'; one of "
                                + err.splitlines()[0].split("one of ", 1)[1],
                                f"error: {bad}: action.z: unknown key", "nothing registered: 2 problem(s)"]  # fmt: skip
    code, _, err = cli("rules", "register", str(tmp_path / "rule.yaml"))
    assert code == 1
    assert "cannot read" in err


def test_sdk(client: Client, conn: Conn) -> None:
    action(conn)
    trigger(conn)
    assert client.register_rule(RULE)["created"] is True
    assert client.register_rule({"name": "two", "pack": "ci", "trigger": {"type": "test.push"},
                                 "action": {"ref": "test.echo"}})["ref"] == "ci.two"  # fmt: skip
    assert [r["ref"] for r in client.rules()] == ["ci.on_push", "ci.two"]
    assert client.disable_rule("ci.two") is True
    assert client.rule("ci.two")["enabled"] is False
    with pytest.raises(InvalidRuleError):
        client.register_rules([RULE, "ref: broken"])
    client.delete_rule("ci.two")
    with pytest.raises(NotFoundError):
        client.delete_rule("ci.two")
    with pytest.raises(NotFoundError):
        client.register_rule(RULE.replace("test.push", "no.trigger"))


async def test_a_rule_on_a_workflow_starts_it(client: Client, conn: Conn, pool: Pool, transport: Any) -> None:
    trigger(conn)
    client.register_workflow("ref: ci.flow\ninput: [who]\ntasks: {hi: {action: core.noop}}\n")
    client.register_rule({"ref": "ci.start_flow", "trigger": "test.push",
                          "action": {"ref": "ci.flow", "parameters": {"who": "{{ trigger.by }}"}}})  # fmt: skip
    event = emit(conn, {"by": "ann"})
    await run_pass(pool)
    [f] = enforcements(conn, event)
    assert f["outcome"] == "requested", f
    await start(pool, transport)
    row = conn.execute("SELECT status, parameters FROM execution WHERE id = %s", (f["execution"],)).fetchone()
    assert row == {"status": "running", "parameters": {"who": "ann"}}
    assert state(conn, f["execution"]) is not None  # the workflow started
