"""Acceptance: the ``conveyor`` command line used as a user would, against real processes
(``up``, ``executor``, ``worker``) and a real PostgreSQL."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from acceptance.helpers import (
    Procs,
    conveyor_env,
    describe,
    eventually,
    processes_with_argv,
    stays,
)
from conveyor.domain.status import TERMINAL

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _execution(procs: Procs, execution_id: int) -> dict[str, Any]:
    return procs.json("executions", "get", str(execution_id))  # type: ignore[no-any-return]


def _request(procs: Procs, *args: str) -> int:
    """``conveyor run ... `` without --wait: prints the id alone."""
    result = procs.run("run", *args)
    assert result.returncode == 0, describe(result)
    assert re.fullmatch(r"\d+\n", result.stdout), describe(result)
    return int(result.stdout)


def _terminal(procs: Procs, execution_id: int, timeout: float = 20) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        e = _execution(procs, execution_id)
        return e if e["status"] in TERMINAL else None

    return eventually(done, timeout, interval=0.1, message=procs.logs)


# -- 1. the happy path with `conveyor up` ---------------------------------------------------


def test_up_run_inspect_and_stop(procs: Procs) -> None:
    up = procs.start("up", name="up")
    up.wait_for_log("Conveyor is up")
    worker_name = f"{socket.gethostname()}-{up.pid}"

    waited = procs.run("run", "core.echo", "message=hello", "--wait")
    assert waited.returncode == 0, describe(waited)
    assert "completed" in waited.stdout
    assert "hello" in waited.stdout

    execution_id = _request(procs, "core.echo", "message=hi")
    execution = _terminal(procs, execution_id)
    assert execution["status"] == "completed"
    assert execution["result"]["data"] == "hi"
    assert execution["worker_name"] == worker_name
    assert [(a["attempt"], a["worker_name"], a["outcome"]) for a in execution["attempts"]] == [
        (1, worker_name, "completed")
    ]

    listed = procs.json("executions", "list", "--status", "completed")
    assert {e["status"] for e in listed} == {"completed"}
    assert execution_id in {e["id"] for e in listed}
    assert len(listed) == 2

    workers = procs.json("workers", "list")
    assert [(w["name"], w["status"], w["pid"]) for w in workers] == [(worker_name, "active", up.pid)]
    assert isinstance(workers[0]["heartbeat_age"], float)
    assert 0 <= workers[0]["heartbeat_age"] < 5

    up.signal(signal.SIGTERM)
    assert up.wait(10) == 0, up.logs()
    workers = procs.json("workers", "list")
    assert [(w["name"], w["status"]) for w in workers] == [(worker_name, "inactive")]


def test_an_idle_worker_stops_promptly_with_default_heartbeats(procs: Procs, env: dict[str, str]) -> None:
    """SIGTERM is not held up by the liveness connection's wait between heartbeats
    (10 s by default): draining goes through the pool."""
    defaults = {k: v for k, v in env.items() if k != "CONVEYOR__WORKER__HEARTBEAT_INTERVAL"}
    worker = procs.start("worker", "--name", "w-idle", name="worker", env=defaults)
    worker.wait_for_log("worker registered")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(8) == 0, worker.logs()
    assert time.monotonic() - started < 3, worker.logs()


# -- 2. a worker that starts after the request ------------------------------------------


def test_worker_started_after_the_request(procs: Procs, env: dict[str, str]) -> None:
    executor = procs.start("executor", name="executor", env={**env, "CONVEYOR__EXECUTOR__NO_WORKER_GRACE": "60"})
    executor.wait_for_log("executor started")

    execution_id = _request(procs, "core.echo", "message=late")

    def waiting() -> bool:
        e = _execution(procs, execution_id)
        # "scheduling" is the executor's short-lived claim of a round: it is handed back.
        return e["status"] in ("requested", "scheduling") and e["worker"] is None

    stays(waiting, duration=1.5, message="the execution must wait for a worker (no_worker_grace=60)")

    procs.start("worker", "--name", "late", name="worker-late")
    execution = _terminal(procs, execution_id)
    assert execution["status"] == "completed", execution
    assert execution["worker_name"] == "late"
    assert execution["result"]["data"] == "late"


# -- 3. two workers share the load ----------------------------------------------------------


def test_two_workers_share_load(procs: Procs, env: dict[str, str], db_url: str) -> None:
    from conveyor.sdk import request_executions
    from conveyor.store.db import connect_sync

    procs.start("executor", name="executor").wait_for_log("executor started")
    worker_env = {**env, "CONVEYOR__WORKER__MAX_CONCURRENT_TASKS": "2"}
    for name in ("w1", "w2"):
        procs.start("worker", "--name", name, name=name, env=worker_env).wait_for_log("worker registered")

    # One batch, so that the placement (not the timing of 8 CLI processes) decides.
    with connect_sync(db_url, "conveyor") as conn:
        ids = request_executions(conn, [("core.sleep", {"seconds": 0.5})] * 8)

    def all_completed() -> list[dict[str, Any]] | None:
        rows = procs.json("executions", "list", "--action", "core.sleep")
        return rows if len(rows) == 8 and all(r["status"] == "completed" for r in rows) else None

    rows = eventually(all_completed, timeout=30, interval=0.2, message=procs.logs)
    assert {r["id"] for r in rows} == set(ids)
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_worker.setdefault(r["worker_name"], []).append(r)
    assert set(by_worker) == {"w1", "w2"}, {w: len(rs) for w, rs in by_worker.items()}
    # Neither worker ever ran more than its max_concurrent_tasks at once.
    for name, runs in by_worker.items():
        spans = [(datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"])) for r in runs]
        for start, _ in spans:
            at_once = [s for s in spans if s[0] <= start < s[1]]
            assert len(at_once) <= 2, (name, at_once)


# -- 4. a subprocess action that times out ------------------------------------------------


def test_subprocess_action_timeout_kills_the_child(procs: Procs, env: dict[str, str], tmp_path: Path) -> None:
    # A unique argv, so that the check for a leftover process cannot see someone else's sleep.
    argv = ["sleep", f"31.{random.randrange(10**8):08d}"]
    (tmp_path / "slowmod.py").write_text(
        "from conveyor import subprocess_action\n\n"
        f"subprocess_action('test.slow', argv={argv!r}, stdin='none', timeout=4)\n"
    )  # 4 s: long enough to be seen running after the request's CLI returns, on a loaded machine
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))}
    procs.start("up", "--import", "slowmod", name="up", env=env).wait_for_log("Conveyor is up")

    # Seen while it runs: proves the check for leftovers below can see the process at all.
    execution_id = _request(procs, "test.slow")
    eventually(lambda: processes_with_argv(argv), timeout=10, message=procs.logs)
    execution = _terminal(procs, execution_id)
    assert execution["status"] == "timeout", execution
    assert "timed out" in execution["result"]["error"]
    assert processes_with_argv(argv) == [], "the timed-out child is still running"

    waited = procs.run("run", "test.slow", "--wait")
    assert waited.returncode != 0, describe(waited)
    assert "timeout" in waited.stdout
    assert processes_with_argv(argv) == [], "the timed-out child is still running"


# -- 5. a crashing subprocess ------------------------------------------------------------------


def test_crashing_subprocess_fails_and_worker_survives(procs: Procs) -> None:
    up = procs.start("up", name="up")
    up.wait_for_log("Conveyor is up")

    waited = procs.run("run", "core.local", "cmd=echo boom >&2; kill -SEGV $$", "--wait", "--json")
    assert waited.returncode != 0, describe(waited)
    execution = json.loads(waited.stdout)
    assert execution["status"] == "failed"
    result = execution["result"]
    assert result["stderr"] == "boom\n"
    assert result["exit_code"] == -signal.SIGSEGV
    assert result["error"] == f"killed by signal {int(signal.SIGSEGV)}"
    assert execution["attempts"][0]["outcome"] == "failed"

    assert up.returncode is None, up.logs()
    after = procs.run("run", "core.echo", "message=still-here", "--wait")
    assert after.returncode == 0, describe(after)
    assert "still-here" in after.stdout


# -- 6. output beyond the limit ----------------------------------------------------------------


def test_oversized_output_is_truncated(procs: Procs, env: dict[str, str]) -> None:
    limit = 1024 * 1024
    procs.start("up", name="up", env={**env, "CONVEYOR__WORKER__OUTPUT_LIMIT": str(limit)}).wait_for_log(
        "Conveyor is up"
    )

    waited = procs.run("run", "core.local", "cmd=head -c 12582912 /dev/zero | tr '\\0' x", "--wait", "--json")
    assert waited.returncode == 0, describe(waited)
    execution = json.loads(waited.stdout)
    assert execution["status"] == "completed"
    result = execution["result"]
    assert result["stdout_truncated"] is True
    assert result["stderr_truncated"] is False
    assert 0 < len(result["stdout"].encode()) <= limit
    assert set(result["stdout"]) == {"x"}


# -- 7. invalid requests -------------------------------------------------------------------


def test_invalid_parameters_and_unknown_action(procs: Procs) -> None:
    bad = procs.run("run", "core.sleep", "seconds=abc")
    assert bad.returncode == 1, describe(bad)
    assert "seconds" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert bad.stdout == ""

    unknown = procs.run("run", "core.nope")
    assert unknown.returncode == 1, describe(unknown)
    assert "unknown action" in unknown.stderr
    assert "core.nope" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    assert procs.json("executions", "list") == []


# -- 8. no worker at all ---------------------------------------------------------------------


def test_no_workers_fails_the_execution(procs: Procs) -> None:
    procs.start("executor", name="executor").wait_for_log("executor started")

    waited = procs.run("run", "core.echo", "message=x", "--wait", "--json", timeout=30)
    assert waited.returncode != 0, describe(waited)
    execution = json.loads(waited.stdout)
    assert execution["status"] == "failed"
    assert "no workers available" in execution["result"]["error"]
    assert execution["worker"] is None


# -- 10. configuration -------------------------------------------------------------------


def test_config_show_sources(procs: Procs, env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "conveyor.yaml"
    config.write_text("executor:\n  batch_size: 42\nworker:\n  heartbeat_interval: 4\n  max_concurrent_tasks: 3\n")
    env = {**env, "CONVEYOR__WORKER__MAX_CONCURRENT_TASKS": "7"}

    shown = procs.json("--config", str(config), "config", "show", env=env)
    assert shown["executor.batch_size"] == {"value": 42, "source": f"file {config}"}
    # The environment wins over the file.
    assert shown["worker.max_concurrent_tasks"] == {"value": 7, "source": "env CONVEYOR__WORKER__MAX_CONCURRENT_TASKS"}
    assert shown["worker.heartbeat_interval"] == {"value": 1.0, "source": "env CONVEYOR__WORKER__HEARTBEAT_INTERVAL"}
    assert shown["executor.claim_timeout"] == {"value": 30.0, "source": "default"}
    assert shown["database.url"]["source"] == "env DATABASE_URL"

    without_file = procs.json("config", "show", env=env)
    assert without_file["executor.batch_size"] == {"value": 100, "source": "default"}

    missing = procs.run("--config", str(tmp_path / "nope.yaml"), "config", "show", env=env)
    assert missing.returncode == 1, describe(missing)
    assert "nope.yaml" in missing.stderr
    assert "Traceback" not in missing.stderr


# -- 11. migrations ----------------------------------------------------------------------


def test_migrate_twice(procs: Procs, empty_db_url: str) -> None:
    env = conveyor_env(empty_db_url)
    first = procs.run("migrate", env=env)
    assert first.returncode == 0, describe(first)
    assert "applied 0001_initial" in first.stdout
    second = procs.run("migrate", env=env)
    assert second.returncode == 0, describe(second)
    assert "up to date" in second.stdout
    assert "applied" not in second.stdout


def test_executions_cancel(procs: Procs, env: dict[str, str], db_url: str) -> None:
    """`conveyor executions cancel`: a running subprocess action is stopped by its worker
    (process group killed) and recorded cancelled; one not yet placed is cancelled at
    once; a finished one is refused without a traceback."""
    from conveyor.sdk import request_execution
    from conveyor.store.db import connect_sync

    procs.start("executor", name="executor").wait_for_log("executor started")
    procs.start("worker", "--name", "w1", name="w1").wait_for_log("worker registered")
    with connect_sync(db_url, "conveyor", autocommit=True) as conn:
        running = request_execution(conn, "core.local", {"cmd": "sleep 60"})
        eventually(lambda: _execution(procs, running)["status"] == "running", timeout=20, message=procs.logs)
        eventually(lambda: processes_with_argv(["sleep", "60"]), timeout=10, message="the action's process runs")
        result = procs.run("executions", "cancel", str(running), "--wait", "--timeout", "20")
        assert result.returncode == 0, describe(result)
        assert "cancelled" in result.stdout
        shown = _execution(procs, running)
        assert shown["status"] == "cancelled"
        assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [(1, "cancelled")]
        assert not processes_with_argv(["sleep", "60"]), "the action's process was killed"

        finished = procs.run("executions", "cancel", str(running))
        assert finished.returncode == 1
        assert f"execution {running} is cancelled: nothing to cancel" in finished.stderr
        assert "Traceback" not in finished.stderr

        missing = procs.run("executions", "cancel", "999999")
        assert missing.returncode == 1
        assert "no execution with id 999999" in missing.stderr
