"""Acceptance: ``conveyor policies list|set|delete`` and the admission line of ``conveyor
executions get``, through the real command line in subprocesses; and one policy seen at
work under ``conveyor up``: three requests run one at a time, in request order.

Independent commands run concurrently to keep the file quick."""

from __future__ import annotations

import itertools
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from acceptance.helpers import Procs, conveyor_env, describe, eventually, run_cli
from conveyor.actions.registry import ActionRegistry
from conveyor.store.queries import Q
from conveyor.store.rows import action_row

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]
Result = subprocess.CompletedProcess[str]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _many(env: dict[str, str], *commands: tuple[str, ...]) -> list[Result]:
    """Independent commands at once (each is its own process), results in order."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda args: run_cli(*args, env=env), commands))


def _ok(result: Result) -> str:
    assert result.returncode == 0, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    return result.stdout


def _fails(result: Result, text: str, code: int = 1) -> None:
    """A refusal: this exit code, the message on stderr, no traceback."""
    assert result.returncode == code, describe(result)
    assert text in result.stderr, describe(result)
    assert "Traceback" not in result.stderr + result.stdout, describe(result)
    if code == 1:
        assert len(result.stderr.strip().splitlines()) == 1, describe(result)


def _request(conn: Conn, ref: str, parameters: dict[str, Any], times: int = 1) -> list[int]:
    """Requests made in one transaction (so in this order, with nothing in between)."""
    with conn.transaction():
        rows = [conn.execute("SELECT request_execution(%s, %s) AS id", (ref, Jsonb(parameters))).fetchone()
                for _ in range(times)]  # fmt: skip
    return [int(r["id"]) for r in rows if r is not None]


def test_set_list_delete_and_their_errors(env: dict[str, str], conn: Conn) -> None:
    # An action whose definition declares a policy, as a worker would register it.
    registry = ActionRegistry()
    registry.subprocess_action("shop.report", argv=["true"], policy={"concurrency": 2, "parameters": ["region"]})
    conn.execute(Q["upsert_action"], action_row(next(iter(registry))))

    created = _many(
        env,
        ("policies", "set", "core.echo", "--concurrency", "2", "--group-by", "message"),
        ("policies", "set", "core", "-n", "5", "--method", "cancel"),
        ("policies", "set", "shop.nothing", "-n", "1"),
        ("policies", "set", "nopack", "-n", "1"),
    )
    assert "policy core.echo set: at most 2 at once per message; others wait in request order" in _ok(created[0])
    assert "policy core set: at most 5 at once; others are cancelled at once" in _ok(created[1])
    assert created[1].stderr == ""
    assert "note: no worker has registered action 'shop.nothing' yet" in created[2].stderr, describe(created[2])
    assert "note: no action of pack 'nopack' is registered yet" in created[3].stderr, describe(created[3])

    results = _many(
        env,
        ("policies", "list", "--json"),
        ("policies", "list"),
        ("policies", "delete", "nopack"),
        ("policies", "set", "core.noop", "-n", "1", "-g", "host"),
        ("policies", "set", "bad target", "-n", "1"),
        ("policies", "set", "core.echo", "-n", "1", "-g", ""),
        ("policies", "set", "core.echo", "--concurrency", "0"),
        ("policies", "set", "core.echo", "-n", "1", "--method", "drop"),
        ("policies", "delete", "nothing.here"),
        ("policies", "delete", "shop.report"),
    )
    listed = json.loads(_ok(results[0]))
    rows = {p["target"]: (p["scope"], p["concurrency"], p["parameters"], p["method"], p["source"]) for p in listed}
    assert rows["core.echo"] == ("action", 2, ["message"], "enqueue", "operator")
    assert rows["core"] == ("pack", 5, [], "cancel", "operator")
    assert rows["shop.report"] == ("action", 2, ["region"], "enqueue", "metadata")
    assert [p["scope"] for p in listed] == sorted((p["scope"] for p in listed), key=["action", "pack"].index)
    assert {"held", "waiting", "created", "updated"} <= set(listed[0])
    table = _ok(results[1])
    for text in ("group by", "held", "waiting", "core.echo", "message", "metadata", "region", "pack", "cancel"):
        assert text in table, table
    assert "policy nopack deleted; 0 waiting execution(s) released" in _ok(results[2])
    assert "note: core.noop takes no parameter 'host'" in _ok(results[3]) + results[3].stderr, describe(results[3])
    _fails(results[4], "error: invalid policy target 'bad target'")
    _fails(results[5], "parameter names must be non-empty")
    _fails(results[6], "error: invalid policy for core.echo: concurrency must be between 1 and 2147483647, not 0")
    _fails(results[7], "'drop' is not one of", code=2)
    _fails(results[8], "error: no admission policy for 'nothing.here'")
    _fails(results[9], "comes from the action's definition")

    # An override of the definition's policy; deleting it puts the definition's back.
    _ok(run_cli("policies", "set", "shop.report", "-n", "7", env=env))
    deleted = _ok(run_cli("policies", "delete", "shop.report", env=env))
    assert "policy shop.report deleted" in deleted
    assert "the action's own policy applies again: at most 2 at once per region" in deleted


def test_executions_get_shows_where_an_execution_stands(env: dict[str, str], conn: Conn) -> None:
    _ok(run_cli("policies", "set", "core.echo", "-n", "1", "-g", "message", env=env))
    first, _, third = _request(conn, "core.echo", {"message": "a"}, times=3)
    alone = _request(conn, "core.noop", {})[0]
    holding, waiting, waiting_json, none = _many(
        env,
        ("executions", "get", str(first)),
        ("executions", "get", str(third)),
        ("executions", "get", str(third), "--json"),
        ("executions", "get", str(alone)),
    )
    assert 'holding a slot of policy core.echo, group {"message": "a"}' in _ok(holding)
    assert 'waiting for admission: policy core.echo, group {"message": "a"}, 1 ahead (since ' in _ok(waiting)
    detail = json.loads(_ok(waiting_json))
    assert {k: detail["admission"][k] for k in ("state", "policy", "group_key", "ahead")} == {
        "state": "waiting", "policy": "core.echo", "group_key": {"message": "a"}, "ahead": 1}  # fmt: skip
    assert "admission" not in _ok(none)
    assert "holding" not in none.stdout


def test_concurrency_one_runs_requests_one_at_a_time_in_order(procs: Procs, conn: Conn) -> None:
    up = procs.start("up", name="up")
    _ok(procs.run("policies", "set", "core.sleep", "--concurrency", "1"))
    up.wait_for_log("Conveyor is up", timeout=30)

    ids = _request(conn, "core.sleep", {"seconds": 1}, times=3)

    def runs() -> list[dict[str, Any]] | None:
        rows = conn.execute(
            "SELECT id, status, started, ended FROM execution WHERE id = ANY(%s) ORDER BY started", (ids,)
        ).fetchall()
        return rows if all(r["status"] == "completed" for r in rows) else None

    done = eventually(runs, timeout=20, interval=0.1, message=procs.logs)
    assert [r["id"] for r in done] == ids  # started in request order
    for before, after in itertools.pairwise(done):
        assert before["ended"] <= after["started"], done  # never two at once
