"""Acceptance: nothing an action produces can take a worker down (issue #11).

``conveyor up`` (executor, worker and API in one process) runs actions returning what
PostgreSQL cannot store (a NUL, a lone surrogate) and commands printing a NUL or bytes
that are not UTF-8. The process stays up and its worker keeps heartbeating; the Python
values fail their executions with the reason, the output is stored exactly (base64,
marked), the API and the CLI read every row, and the next execution still runs."""

from __future__ import annotations

import base64
import socket
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually
from conveyor.domain.tokens import Role, token_row
from conveyor.sdk import request_execution
from conveyor.store.queries import Q

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]
TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}

ACTIONS = """
from conveyor import action


@action("bad.nul")
def nul() -> str:
    return "a\\x00b"


@action("bad.surrogate")
async def surrogate() -> str:
    return "\\ud800"


@action("bad.object")
def thing() -> object:
    return object()
"""


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _heartbeat(db: Db) -> Any:
    row = db.execute("SELECT last_heartbeat FROM worker WHERE status = 'active'").fetchone()
    return None if row is None else row["last_heartbeat"]


def test_unstorable_results_do_not_take_the_worker_down(procs: Procs, env: dict[str, str], db: Db,
                                                        tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "badmod.py").write_text(ACTIONS)
    port = _free_port()
    env = {**env, "PYTHONPATH": f"{tmp_path}:{env.get('PYTHONPATH', '')}", "CONVEYOR__API__PORT": str(port)}
    up = procs.start("up", "--import", "badmod", name="up", env=env)
    up.wait_for_log("API listening", timeout=30)
    first_beat = eventually(lambda: _heartbeat(db), timeout=20, message=procs.logs)

    def finished(eid: int) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            if up.returncode is not None:
                return {"status": "conveyor up exited"}
            row = db.execute("SELECT status, result FROM execution WHERE id = %s", (eid,)).fetchone()
            return row if row is not None and row["status"] in TERMINAL else None

        row = eventually(check, timeout=30, interval=0.1, message=procs.logs)
        assert up.returncode is None, f"conveyor up died running execution {eid}\n{up.logs()}"
        return row

    def echo_runs() -> None:
        eid = request_execution(db, "core.echo", {"message": "still here"})
        row = finished(eid)
        assert (row["status"], row["result"]["data"]) == ("completed", "still here")

    ids: dict[str, int] = {}
    for ref, why in [("bad.nul", "a NUL character"), ("bad.surrogate", "an unpaired surrogate (\\ud800)"),
                     ("bad.object", "Object of type object is not JSON serializable")]:  # fmt: skip
        ids[ref] = eid = request_execution(db, ref, {})
        row = finished(eid)
        assert row["status"] == "failed", row
        assert row["result"]["error"].startswith("the returned value cannot be stored: "), row
        assert why in row["result"]["error"]
        attempt = db.execute("SELECT outcome, error FROM execution_attempt WHERE execution = %s", (eid,)).fetchall()
        assert attempt == [{"outcome": "failed", "error": row["result"]["error"]}]  # one attempt: not re-run
        echo_runs()

    for name, command, raw in [("nul", 'printf "a\\0b"', b"a\x00b"), ("latin1", "printf 'caf\\351\\n'", b"caf\xe9\n")]:
        ids[name] = eid = request_execution(db, "core.local", {"cmd": command})
        row = finished(eid)
        assert row["status"] == "completed", row
        result = row["result"]
        assert (result["stdout_encoding"], result["stderr_encoding"]) == ("base64", "utf-8")
        assert base64.b64decode(result["stdout"]) == raw
        echo_runs()

    # The issue's own reproduction, through the command line.
    shown = procs.run("run", "core.local", "cmd=printf 'a\\0b'", "--wait", "--timeout", "30")
    assert shown.returncode == 0, describe(shown)
    assert "stdout (not UTF-8 text: stored as base64, shown with \\xNN escapes):\na\\x00b" in shown.stdout

    # The worker kept its standing all along: heartbeats went on, nothing was recovered.
    eventually(lambda: _heartbeat(db) > first_beat, timeout=10, message=procs.logs)
    assert db.execute("SELECT count(*) AS n FROM worker").fetchone()["n"] == 1
    assert up.returncode is None

    # The API and the CLI read every one of these rows.
    token, params = token_row("test viewer", Role.viewer)
    db.execute(Q["create_token"], params)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as api:
        listed = api.get("/api/v1/executions", params={"limit": 500})
        assert listed.status_code == 200, listed.text
        assert {i["id"] for i in listed.json()["items"]} >= set(ids.values())
        for eid in ids.values():
            one = api.get(f"/api/v1/executions/{eid}")
            assert one.status_code == 200, one.text
            page = api.get(f"/executions/{eid}")
            assert page.status_code == 200, page.text
        assert "a\\x00b" in api.get(f"/executions/{ids['nul']}").text  # the output, readable
    shown = procs.run("executions", "get", str(ids["latin1"]))
    assert shown.returncode == 0, describe(shown)
    assert "caf\\xe9" in shown.stdout
    assert "base64" in shown.stdout
    listed_cli = procs.run("executions", "list", "--json")
    assert listed_cli.returncode == 0, describe(listed_cli)
