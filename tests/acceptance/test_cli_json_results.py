"""Acceptance: ``--json`` on the commands that change something (issue #15), through real
``conveyor`` processes against a real PostgreSQL. Stdout is one JSON document (parsed
whole: a stray line would fail it); it describes the object as the read commands' --json
shows it after the change, ``{"deleted": ...}`` for a deletion, counts for a bulk delete. A
refusal prints nothing on stdout and one line on stderr, with --json as without.

Independent commands run concurrently to keep the file quick."""

from __future__ import annotations

import json
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import CONVEYOR, conveyor_env, describe, run_cli

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]
Result = subprocess.CompletedProcess[str]

WORKFLOW = """
ref: demo.hello
tasks:
  say:
    action: core.echo message=hello
"""

RULE = """
ref: ci.on_push
trigger: test.push
action: {ref: core.echo, parameters: {message: pushed}}
"""


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _many(env: dict[str, str], *commands: tuple[str, ...]) -> list[Result]:
    """Independent commands at once (each its own process), results in order."""
    with ThreadPoolExecutor(max_workers=min(len(commands), 4)) as pool:
        return list(pool.map(lambda args: run_cli(*args, env=env), commands))


def _doc(result: Result) -> Any:
    """The command succeeded and its whole stdout is one JSON document."""
    assert result.returncode == 0, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    return json.loads(result.stdout)


def _refused(result: Result, text: str) -> None:
    """Exit code 1, nothing on stdout, the error alone on one line of stderr."""
    assert result.returncode == 1, describe(result)
    assert result.stdout == "", describe(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, describe(result)
    assert lines[0].startswith("error: "), describe(result)
    assert text in lines[0], describe(result)


def _cli(env: dict[str, str], *args: str) -> Result:
    return run_cli(*args, env=env)


def test_executions_cancel_rerun_and_purge(env: dict[str, str], db: Conn) -> None:
    row = db.execute("SELECT request_execution('core.noop', '{}') AS id").fetchone()
    assert row is not None
    first = int(row["id"])  # no executor runs: it stays requested

    cancelled = _doc(_cli(env, "executions", "cancel", str(first), "--json"))
    assert (cancelled["id"], cancelled["status"], cancelled["action_ref"]) == (first, "cancelled", "core.noop")
    assert cancelled["cancelled_by"] == "cli"
    assert {"admission", "workflow", "attempts"} <= cancelled.keys()  # as `executions get --json` shows it

    rerun = _doc(_cli(env, "executions", "rerun", str(first), "--json"))
    assert rerun["id"] != first
    assert (rerun["action_ref"], rerun["status"], rerun["parameters"]) == ("core.noop", "requested", {})

    again, pause, missing = _many(
        env,
        ("executions", "cancel", str(first), "--json"),
        ("executions", "pause", str(rerun["id"]), "--json"),
        ("executions", "rerun", "999999", "--json"),
    )
    _refused(again, f"execution {first} is cancelled: nothing to cancel")
    _refused(pause, f"execution {rerun['id']}")
    _refused(missing, "no execution with id 999999")

    # Finished (last changed) three days ago: purgeable with --older-than 2d. Triggers off:
    # they stamp `updated` with now().
    db.execute("SET session_replication_role = replica")
    db.execute("UPDATE execution SET updated = now() - interval '3 days' WHERE id = %s", (first,))
    db.execute("RESET session_replication_role")
    dry = _doc(_cli(env, "executions", "purge", "--older-than", "2d", "--dry-run", "--json"))
    assert dry == {"matched": 1, "purged": 0}
    # The question goes to stderr: stdout stays for the document (here: none, not confirmed).
    unconfirmed = _cli(env, "executions", "purge", "--older-than", "2d", "--json")
    assert unconfirmed.returncode == 1, describe(unconfirmed)
    assert unconfirmed.stdout == "", describe(unconfirmed)
    assert unconfirmed.stderr.strip().splitlines()[-1].startswith("error: not confirmed"), describe(unconfirmed)
    answered = subprocess.run([*CONVEYOR, "executions", "purge", "--older-than", "2d", "--json"], input="y\n",
                              env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert _doc(answered) == {"matched": 1, "purged": 1}  # no progress bar around it
    assert "[y/N]" in answered.stderr, describe(answered)
    assert db.execute("SELECT count(*) AS n FROM execution WHERE id = %s", (first,)).fetchone() == {"n": 0}


def test_workers_policies_and_tokens(env: dict[str, str], db: Conn) -> None:
    db.execute(
        "INSERT INTO worker (name, runtimes, actions, capacity, stale_after, lock_grace, lock_epoch, last_heartbeat)"
        " VALUES ('w1', '{python}', '{core.echo}', 10, 3600, 1, pg_postmaster_start_time(), now())"
    )
    cordoned = _doc(_cli(env, "workers", "cordon", "w1", "--json"))
    assert (cordoned["name"], cordoned["cordoned"], cordoned["capacity"]) == ("w1", True, 10)
    uncordoned = _doc(_cli(env, "workers", "uncordon", "w1", "--json"))
    assert (uncordoned["name"], uncordoned["cordoned"]) == ("w1", False)

    drained, policy, token, unknown_worker = _many(
        env,
        ("workers", "drain", "w1", "--json"),
        ("policies", "set", "core.echo", "-n", "2", "--group-by", "message", "--json"),
        ("tokens", "create", "--role", "operator", "--name", "ci", "--json"),
        ("workers", "cordon", "nope", "--json"),
    )
    assert {k: _doc(drained)[k] for k in ("name", "cordoned", "handed_back")} == {
        "name": "w1", "cordoned": True, "handed_back": 0
    }  # fmt: skip
    set_ = _doc(policy)
    assert (set_["target"], set_["concurrency"], set_["parameters"], set_["method"]) == (
        "core.echo", 2, ["message"], "enqueue"
    )  # fmt: skip
    assert policy.stderr == "", describe(policy)
    created = _doc(token)
    assert (created["name"], created["role"], created["revoked"]) == ("ci", "operator", None)
    assert created["token"].startswith(created["prefix"])
    _refused(unknown_worker, "no worker named 'nope'")

    deleted, revoked = _many(
        env, ("policies", "delete", "core.echo", "--json"), ("tokens", "revoke", str(created["id"]), "--json")
    )
    assert _doc(deleted) == {"deleted": "core.echo", "released": 0, "restored": None}
    shown = _doc(revoked)
    assert (shown["id"], shown["revoked"] is not None, "token" in shown) == (created["id"], True, False)

    no_policy, no_token = _many(
        env, ("policies", "delete", "core.echo", "--json"), ("tokens", "revoke", str(created["id"]), "--json")
    )
    _refused(no_policy, "core.echo")
    _refused(no_token, f"no live token with id {created['id']}")


def test_workflows_rules_webhooks_and_schedules(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "hello.yaml").write_text(WORKFLOW)
    (tmp_path / "rule.yaml").write_text(RULE)
    trigger = _cli(env, "triggers", "register", "test.push", "--json")
    assert _doc(trigger)["name"] == "test.push"

    workflow, rule, hook, schedule = _many(
        env,
        ("workflows", "register", str(tmp_path / "hello.yaml"), "--json"),
        ("rules", "register", str(tmp_path / "rule.yaml"), "--json"),
        ("webhooks", "create", "hook", "--generate-secret", "--json"),
        ("schedules", "create", "tick", "--interval", "1h", "core.noop", "--json"),
    )
    [registered] = _doc(workflow)
    assert (registered["ref"], registered["version"]) == ("demo.hello", 1)
    assert registered["source"] == WORKFLOW  # as `workflows get --json` shows it
    [registered_rule] = _doc(rule)
    assert (registered_rule["ref"], registered_rule["created_now"], registered_rule["enabled"]) == (
        "ci.on_push", True, True
    )  # fmt: skip
    made = _doc(hook)
    assert (made["name"], made["created_now"], made["secret_set"], made["enabled"]) == ("hook", True, True, True)
    assert len(made["secret"]) >= 32, describe(hook)
    assert hook.stderr == "", describe(hook)
    assert _doc(schedule)["name"] == "tick"

    changes = _many(
        env,
        ("rules", "disable", "ci.on_push", "--json"),
        ("webhooks", "disable", "hook", "--json"),
        ("schedules", "pause", "tick", "--json"),
    )
    assert [(d["enabled"], d["changed"]) for d in map(_doc, changes[:2])] == [(False, True), (False, True)]
    paused = _doc(changes[2])
    assert (paused["name"], paused["paused"], paused["changed"]) == ("tick", True, True)

    repeated = _many(
        env,
        ("rules", "disable", "ci.on_push", "--json"),
        ("webhooks", "enable", "hook", "--json"),
        ("schedules", "resume", "tick", "--json"),
    )
    assert _doc(repeated[0])["changed"] is False  # it already was
    assert (_doc(repeated[1])["enabled"], _doc(repeated[2])["paused"]) == (True, False)

    deleted = _many(
        env,
        ("workflows", "delete", "demo.hello", "--json"),
        ("rules", "delete", "ci.on_push", "--json"),
        ("webhooks", "delete", "hook", "--json"),
        ("schedules", "delete", "tick", "--json"),
    )
    assert [_doc(d) for d in deleted] == [
        {"deleted": "demo.hello", "versions": 1}, {"deleted": "ci.on_push"}, {"deleted": "hook"}, {"deleted": "tick"}
    ]  # fmt: skip

    gone = _many(
        env,
        ("workflows", "delete", "demo.hello", "--json"),
        ("rules", "delete", "ci.on_push", "--json"),
        ("webhooks", "enable", "hook", "--json"),
        ("schedules", "pause", "tick", "--json"),
    )
    for result, name in zip(gone, ["demo.hello", "ci.on_push", "hook", "tick"], strict=True):
        _refused(result, name)

    # Problems in a definition are listed one per line (every one), stdout stays empty.
    (tmp_path / "broken.yaml").write_text("ref: demo.broken\ntasks:\n  first:\n    action: nope.nothing\n")
    broken = _cli(env, "workflows", "register", str(tmp_path / "broken.yaml"), "--json")
    assert (broken.returncode, broken.stdout) == (1, ""), describe(broken)
    assert "nothing registered" in broken.stderr, describe(broken)
    assert "Traceback" not in broken.stderr, describe(broken)


def test_dead_letters(env: dict[str, str]) -> None:
    purged, replayed, refused = _many(
        env,
        ("dead-letters", "purge", "--all", "--yes", "--json"),
        ("dead-letters", "replay", "--reason", "expired", "--yes", "--json"),
        ("dead-letters", "replay", "--json"),
    )
    assert _doc(purged) == {"matched": 0, "purged": 0}
    assert _doc(replayed) == []
    _refused(refused, "replay needs dead letter ids or at least one filter")


def test_config_show_computed_values() -> None:
    """Settings left unset that the services compute show that value, source ``computed``."""
    env = conveyor_env(None, CONVEYOR__MESSAGE_QUEUE__PREFIX="shop", CONVEYOR__WORKER__MAX_CONCURRENT_TASKS="200")
    shown = _doc(run_cli("config", "show", "--json", env=env))
    assert shown["dead_letter.exchange"] == {"value": "shop.dlx", "source": "computed"}
    assert shown["worker.prefetch"] == {"value": 100, "source": "computed"}  # at most 100
    assert shown["worker.name"] == {"value": f"{socket.gethostname()}-<pid>", "source": "computed"}
    assert shown["embedded.data_dir"]["source"] == "computed"
    assert shown["embedded.data_dir"]["value"].endswith("/pgdata")
    assert shown["health.port"] == {"value": None, "source": "default"}  # unset is off: nothing to compute

    table = run_cli("config", "show", env=env)
    assert table.returncode == 0, describe(table)
    row = next(ln for ln in table.stdout.splitlines() if "dead_letter.exchange" in ln)
    assert ("shop.dlx" in row, "computed" in row) == (True, True), describe(table)
