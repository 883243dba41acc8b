"""Acceptance (issue #25): input PostgreSQL or Python cannot hold is one line on stderr,
never a traceback, and no process goes down. YAML with a ``"\\x00"`` or ``"\\ud800"``
escape, parameters and answers with a NUL, durations of 99999999999d, and a service whose
health port is taken."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from acceptance.helpers import CONVEYOR, Procs, conveyor_env, describe, eventually

pytestmark = pytest.mark.acceptance

HUGE = "99999999999d"


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, CONVEYOR_USER="alice")


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("error: "), describe(result)
    assert result.stderr.count("\n") == 1, describe(result)
    assert "Traceback" not in result.stdout + result.stderr, describe(result)
    for word in words:
        assert word in result.stderr, describe(result)
    return result.stderr


def run_bytes(env: dict[str, str], *args: str | bytes) -> subprocess.CompletedProcess[str]:
    """A command whose argv holds bytes that are not UTF-8 (Python reads them as lone
    surrogates, \\udcff): what a shell passes for $'\\xff'."""
    argv = [a if isinstance(a, bytes) else a.encode() for a in (*CONVEYOR, *args)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


WORKFLOW = 'ref: t.{name}\nversion: 1.0\ndescription: "{text}"\ntasks:\n  a:\n    action: core.noop\n'
WORKFLOW_INPUT = (
    'ref: t.{name}\nversion: 1.0\ntasks:\n  a:\n    action: core.echo\n    input:\n      message: "{text}"\n'
)
RULE = 'ref: t.{name}\ntrigger: t.push\ndescription: "{text}"\naction:\n  ref: core.noop\n'
ESCAPES = {"nul": ("\\x00", "NUL character"), "surrogate": ("\\ud800", "unpaired surrogate (\\ud800)")}


@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_yaml_with_text_postgresql_refuses_is_one_line(procs: Procs, tmp_path: Path, kind: str) -> None:
    text, says = ESCAPES[kind]
    assert procs.run("triggers", "register", "t.push").returncode == 0
    for i, template in enumerate((WORKFLOW, WORKFLOW_INPUT)):
        path = tmp_path / f"w{i}.yaml"
        path.write_text(template.format(name=f"w{i}", text=text))
        result = procs.run("workflows", "register", str(path))
        assert result.returncode == 1, describe(result)
        assert result.stderr.splitlines()[0].startswith(f"error: {path}: "), describe(result)
        assert says in result.stderr, describe(result)
        assert "Traceback" not in result.stderr, describe(result)
    assert "tasks.a.input.message" in result.stderr, describe(result)
    rule = tmp_path / "rule.yaml"
    rule.write_text(RULE.format(name="r", text=text))
    result = procs.run("rules", "register", str(rule))
    assert result.returncode == 1, describe(result)
    assert "description: contains" in result.stderr, describe(result)
    assert says in result.stderr, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert procs.json("workflows", "list") == []
    assert procs.json("rules", "list") == []


def test_parameters_and_descriptions_postgresql_refuses_are_one_line(procs: Procs, tmp_path: Path) -> None:
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"message": "a\x00b"}))
    one_line_error(procs.run("run", "core.echo", "--params-file", str(params)), "parameters.message", "NUL")
    one_line_error(run_bytes(procs.env, "run", "core.echo", b"message=a\xffb"), "unpaired surrogate (\\udcff)")
    one_line_error(
        run_bytes(procs.env, "schedules", "create", "s", "core.noop", "--interval", "1h", "--description", b"\xff"),
        "description: contains an unpaired surrogate",
    )
    one_line_error(
        run_bytes(procs.env, "schedules", "create", "s", "core.echo", b"message=\xff", "--interval", "1h"),
        "parameters.message",
    )
    assert procs.json("executions", "list") == []
    assert procs.json("schedules", "list") == []


@pytest.mark.parametrize(
    "args",
    [
        ("run", "core.noop", "--in", HUGE),
        ("schedules", "create", "s", "core.noop", "--interval", HUGE),
        ("schedules", "create", "s", "core.noop", "--interval", "1h", "--catchup-window", HUGE),
        ("events", "list", "--since", HUGE),
        ("executions", "purge", "--older-than", HUGE, "--yes"),
        ("executions", "purge", "--older-than", "9" * 400 + "d", "--yes"),
    ],
)
def test_huge_durations_are_one_line(procs: Procs, args: tuple[str, ...]) -> None:
    one_line_error(procs.run(*args), "at most 3650 days")


def test_huge_dead_letter_ages_are_a_usage_error(procs: Procs) -> None:
    for args in (("dead-letters", "list", "--since", HUGE), ("dead-letters", "purge", "--older-than", HUGE)):
        result = procs.run(*args)
        assert result.returncode == 2, describe(result)
        assert "at most 3650 days" in result.stderr, describe(result)
        assert "Traceback" not in result.stderr, describe(result)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.parametrize("service", ["worker", "executor"])
def test_a_taken_health_port_is_one_line_naming_the_setting(env: dict[str, str], taken_port: int, service: str) -> None:
    result = subprocess.run([*CONVEYOR, service], env={**env, "CONVEYOR__HEALTH__PORT": str(taken_port)},
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1, describe(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [result.stderr.splitlines()[-1]], describe(result)
    assert f":{taken_port} (Address already in use)" in errors[0], describe(result)
    assert "CONVEYOR__HEALTH__PORT" in errors[0], describe(result)
    assert "health.port" in errors[0], describe(result)
    assert "Traceback" not in result.stderr, describe(result)


def test_an_answer_with_a_nul_is_one_line_and_the_inquiry_stays_pending(procs: Procs) -> None:
    procs.start("executor", name="executor")
    procs.start("run", "core.ask", "prompt=Ship?", "--wait", name="ask")
    inquiry = eventually(lambda: (procs.json("inquiries", "list") or [None])[0], 30, interval=0.1, message=procs.logs)
    iid = str(inquiry["id"])
    result = procs.run("inquiries", "respond", iid, "--data", '{"r":"a\\u0000b"}')
    one_line_error(result, f"invalid answer for inquiry {iid}: data.r: contains a NUL character")
    assert procs.json("inquiries", "get", iid)["status"] == "pending"
    answered = procs.run("inquiries", "respond", iid, "--data", '{"r":"ab"}', "--as", "bob")
    assert answered.returncode == 0, describe(answered)
