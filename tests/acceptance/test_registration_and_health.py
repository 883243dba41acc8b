"""Acceptance: worker registration (a duplicate name is refused) and the health endpoints
of real ``conveyor`` processes against a real PostgreSQL. Every wait polls the database with a
deadline; the assertions are about what the execution records show."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, until
from acceptance.recovery_kit import RECOVERY_SETTINGS, Conn, start_executor, start_worker, worker_row

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:
    """Every scenario runs on both transports: the same executor and worker code."""
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **transport_env)


# -- g. duplicate worker names ----------------------------------------------------------------


def test_duplicate_worker_name_is_refused(procs: Procs, env: dict[str, str], db: Conn) -> None:
    first = start_worker(procs, env, "dup")
    second = procs.run("worker", "--name", "dup", timeout=30)
    assert second.returncode == 1, describe(second)
    assert "worker name 'dup' is held by a live worker process" in second.stderr, describe(second)
    assert "--name" in second.stderr
    assert "Traceback" not in second.stderr
    # The live worker is untouched.
    assert first.returncode is None
    row = worker_row(db, "dup")
    assert (row["status"], row["pid"]) == ("active", first.pid)


# -- i. health endpoints ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health_endpoints(procs: Procs, env: dict[str, str]) -> None:
    worker_port, executor_port = _free_port(), _free_port()
    health = {"CONVEYOR__HEALTH__HOST": "127.0.0.1"}
    worker = start_worker(procs, {**env, **health}, "w-health", CONVEYOR__HEALTH__PORT=worker_port)
    worker.wait_for_log("health endpoint listening")
    start_executor(procs, {**env, **health}, CONVEYOR__HEALTH__PORT=executor_port)

    base = f"http://127.0.0.1:{worker_port}"
    assert _get(f"{base}/healthz") == (200, {"status": "ok"})
    status, body = until(procs, lambda: (r := _get(f"{base}/readyz"))[0] == 200 and r, timeout=10)
    assert status == 200
    assert body["status"] == "ready"
    assert body["checks"] == {"database": True, "loop": True, "transport": True, "worker": True}
    assert isinstance(body["loop_lag_seconds"], float)
    missing, error = _get(f"{base}/nope")
    assert missing == 404
    assert "/healthz" in error["error"]

    executor_base = f"http://127.0.0.1:{executor_port}"
    until(procs, lambda: _get(f"{executor_base}/healthz")[0] == 200, timeout=10)
    status, body = until(procs, lambda: (r := _get(f"{executor_base}/readyz"))[0] == 200 and r, timeout=10)
    assert body["checks"] == {"database": True, "loop": True, "transport": True, "executor_duties": True}

    with urllib.request.urlopen(f"{executor_base}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        metrics = response.read().decode()
    for name in ("conveyor_dlq_depth", "conveyor_dead_letter_handler_seconds_count", "conveyor_outbox_depth"):
        assert f"\n{name} " in metrics, name

    # The worker serves its own metrics: what it ran, how long it took to start.
    done = procs.run("run", "core.echo", "message=metrics", "--wait")
    assert done.returncode == 0, describe(done)
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        metrics = response.read().decode()
    assert 'conveyor_execution_duration_seconds_count{action="core.echo",outcome="completed"} 1.0' in metrics
    assert "\nconveyor_scheduling_latency_seconds_count 1.0" in metrics
