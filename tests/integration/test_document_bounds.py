"""Integration: every door that reads a user's YAML or JSON refuses the billion-laughs
document, a key named twice and nesting past the bounds with one line, before expanding
anything (issue #25, point 1): the API (workflows, rules, a JSON body, a webhook's door),
the CLI (a real process: its peak RSS is measured) and the SDK. Nothing is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conveyor.domain.errors import InvalidRuleError, InvalidWorkflowError
from conveyor.sdk import Client
from integration.api_kit import Api, error_of
from integration.webhook_kit import post, register, signed
from support.documents import bomb

RSS_LIMIT_MIB = 250  # a CLI process is ~60-90 MiB; the bomb took the API to 772 MB


RULE_BOMB = (
    bomb()
    .replace("ref: tests.bomb", "ref: tests.rule\ntrigger: t\naction: {ref: core.noop}")
    .replace("tasks:\n  a:\n    action: core.noop\n", "criteria:\n  x: *l7\n")
)
TWICE = "ref: tests.twice\ntasks:\n  a:\n    action: core.noop\n  a:\n    action: core.echo\n"
DEEP_JSON = "[" * 150 + "]" * 150


async def test_api_refuses_the_bomb_at_every_door(api: Api) -> None:
    started = time.perf_counter()
    response = await api.post("/api/v1/workflows", json={"source": bomb()})
    took = time.perf_counter() - started
    print(f"\nPOST /api/v1/workflows of the 7-level bomb ({len(bomb())} bytes): {response.status_code} in "
          f"{took * 1000:.1f} ms")  # fmt: skip
    body = response.json()
    assert response.status_code == 422, body
    assert "documents.max_nodes" in body["error"] + json.dumps(body.get("problems")), body
    assert took < 2.0
    assert (await api.client.get("/health/live")).status_code == 200

    twice = await api.post("/api/v1/workflows", json={"source": TWICE})
    assert twice.status_code == 422
    assert "duplicate key 'a' at line 5 (first at line 3)" in twice.text

    rule = await api.post("/api/v1/rules", content=RULE_BOMB.encode())
    assert rule.status_code == 422, rule.text
    assert "documents.max_nodes" in rule.text
    assert await api.sql("SELECT ref FROM action WHERE ref IN ('tests.bomb', 'tests.twice')") == []
    assert await api.sql("SELECT ref FROM rule") == []


async def test_api_json_bodies_are_bounded_with_a_message(api: Api) -> None:
    deep = await api.post(
        "/api/v1/executions", content=f'{{"action_ref": "core.echo", "parameters": {{"m": {DEEP_JSON}}}}}'
    )
    assert error_of(deep, 400) == (
        "request body refused: the document has more than 100 levels of nesting (documents.max_depth)"
    )
    twice = await api.post("/api/v1/executions", content='{"action_ref": "core.echo", "action_ref": "core.noop"}')
    assert error_of(twice, 400) == "request body refused: duplicate key 'action_ref' in a JSON object"
    # A rule's YAML body is not JSON: its route reads it, within the same bounds.
    assert (await api.post("/api/v1/rules", content=TWICE.encode())).status_code == 422
    assert await api.sql("SELECT id FROM execution") == []
    assert (await api.client.get("/health/live")).status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/events"),
        ("POST", "/api/v1/schedules"),
        ("PATCH", "/api/v1/schedules/s"),
        ("POST", "/api/v1/triggers"),
        ("POST", "/api/v1/inquiries/1/respond"),
        ("POST", "/api/v1/workflows"),
    ],
)
async def test_every_json_door_of_the_api_refuses_a_deep_body(api: Api, method: str, path: str) -> None:
    body = f'{{"payload": {DEEP_JSON}, "parameters": {DEEP_JSON}}}'
    response = await api.client.request(method, path, content=body, headers=api.auth("admin"))
    assert "documents.max_depth" in error_of(response, 400)


async def test_a_webhook_door_refuses_deep_or_repeated_json(api: Api) -> None:
    await register(api)
    deep = await post(api, **signed(DEEP_JSON.encode()))
    assert "documents.max_depth" in error_of(deep, 400)
    twice = await post(api, **signed(b'{"a": 1, "a": 2}'))
    assert error_of(twice, 400) == "JSON body refused: duplicate key 'a' in a JSON object"
    assert await api.sql("SELECT id FROM event") == []


def test_sdk_refuses_the_bomb_and_repeated_keys(db_url: str) -> None:
    with Client(db_url) as client:
        with pytest.raises(InvalidWorkflowError, match=r"documents\.max_nodes"):
            client.register_workflow(bomb())
        with pytest.raises(InvalidWorkflowError, match="duplicate key 'a'"):
            client.register_workflow(TWICE)
        with pytest.raises(InvalidRuleError, match=r"documents\.max_nodes"):
            client.register_rule(RULE_BOMB)
        assert client.workflows() == []


# The child's own peak, read from /proc/self/status at exit. Not wait4's ru_maxrss: the
# kernel folds the *parent's* high-water RSS into a vfork'd child's at exec, so in a long
# CI run it reported the pytest worker's ~366 MiB, not the CLI's.
_PEAK_AT_EXIT = """
import atexit, os, runpy, sys
def _peak():
    with open("/proc/self/status") as status, open(os.environ["PEAK_FILE"], "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(_peak)
sys.argv[0] = "conveyor"
runpy.run_module("conveyor", run_name="__main__", alter_sys=True)
"""


def _cli(db_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """``conveyor ARGS`` as a real process: (exit code, stdout, stderr, its own peak RSS in MiB)."""
    with tempfile.TemporaryDirectory() as scratch:
        peak = Path(scratch) / "peak"
        environ = {k: v for k, v in os.environ.items() if k != "CONVEYOR_CONFIG"}
        environ.update(DATABASE_URL=db_url, PEAK_FILE=str(peak), **(env or {}))
        done = subprocess.run(
            [sys.executable, "-c", _PEAK_AT_EXIT, *args], env=environ, capture_output=True, text=True, check=False
        )
        return done.returncode, done.stdout, done.stderr, int(peak.read_text()) / 1024


@pytest.mark.parametrize("levels", [7, 8])
def test_cli_refuses_the_bomb_in_one_line_with_bounded_memory(db_url: str, tmp_path: Path, levels: int) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb(levels))
    started = time.perf_counter()
    code, _, err, rss = _cli(db_url, "workflows", "register", str(path))
    took = time.perf_counter() - started
    print(f"\nconveyor workflows register, {levels}-level bomb: exit {code} in {took:.2f} s, "
          f"peak RSS {rss:.0f} MiB")  # fmt: skip
    assert code == 1
    assert "Traceback" not in err
    assert "documents.max_nodes" in err
    assert rss < RSS_LIMIT_MIB

    rule = tmp_path / "rule.yaml"
    rule.write_text(RULE_BOMB)
    code, _, err, _ = _cli(db_url, "rules", "register", str(rule))
    assert (code, "Traceback" in err, "documents.max_nodes" in err) == (1, False, True), err


def test_cli_json_files_are_bounded_in_one_line(db_url: str, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps({"m": json.loads(DEEP_JSON)}))
    code, _, err, _ = _cli(db_url, "run", "core.echo", "--params-file", str(deep))
    assert (code, err.strip().count("\n"), "Traceback" in err) == (1, 0, False), err
    assert "documents.max_depth" in err
    code, _, err, _ = _cli(db_url, "run", "core.echo", "message=x", f"extra={DEEP_JSON}")
    assert (code, err.strip().count("\n"), "Traceback" in err) == (1, 0, False), err
    # The bound is a setting: raised, the same file passes the reader (and reaches the action's schema).
    code, _, err, _ = _cli(db_url, "run", "core.echo", "--params-file", str(deep),
                           env={"CONVEYOR__DOCUMENTS__MAX_DEPTH": "200"})  # fmt: skip
    assert "documents.max_depth" not in err, err
