"""Acceptance: ``conveyor up`` supervises its embedded PostgreSQL. A postmaster killed with
SIGKILL is restarted and the services resume; an ``up`` killed with SIGKILL leaves its server
running, and the next ``up`` takes it over and stops it on Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually, pid_alive, postmaster_pid, until

pytestmark = pytest.mark.acceptance

# Generous: two cores shared with other test processes (a restart takes about a second alone).
RECOVERY_DEADLINE = 60.0


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not under pytest's tmp_path: its parents are 0700, and as root the server runs as
    # the OS user `pgserver`, which must be able to reach its data directory.
    base = Path(tempfile.mkdtemp(prefix="conveyor-acc-supervise-", dir="/tmp"))
    base.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        yield base / "pgdata"
    finally:
        pid = postmaster_pid(base / "pgdata")
        if pid is not None and pid_alive(pid):  # a failed run must not leave a server behind
            os.kill(pid, signal.SIGQUIT)
            eventually(lambda: not pid_alive(pid), timeout=15)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def env(data_dir: Path) -> dict[str, str]:
    return conveyor_env(None, CONVEYOR__EMBEDDED__DATA_DIR=data_dir)


def _live_postmaster(data_dir: Path) -> int | None:
    pid = postmaster_pid(data_dir)
    return pid if pid is not None and pid_alive(pid) else None


def _echo(procs: Procs, message: str) -> subprocess.CompletedProcess[str] | None:
    """``run core.echo --wait``: its result if it succeeded, else None (to poll on)."""
    result = procs.run("run", "core.echo", f"message={message}", "--wait", timeout=60)
    return result if result.returncode == 0 else None


def _kill_postmaster_and_recover(procs: Procs, data_dir: Path, message: str) -> tuple[float, float]:
    """SIGKILL the postmaster; wait until `up` runs a new one and work completes again.
    Returns (seconds to a new postmaster, seconds until `run --wait` succeeded)."""
    old = _live_postmaster(data_dir)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    print(f"\npostmaster {old} killed at {datetime.now(UTC).isoformat()}")  # to read `up`'s log against
    until(procs, lambda: _live_postmaster(data_dir) not in (None, old), timeout=RECOVERY_DEADLINE, interval=0.05)
    restarted = time.monotonic() - killed
    done = until(procs, lambda: _echo(procs, message), timeout=RECOVERY_DEADLINE, interval=0.2)
    recovered = time.monotonic() - killed
    assert message in done.stdout, describe(done)
    print(f"postmaster killed: new postmaster after {restarted:.2f} s, `run --wait` done after {recovered:.2f} s")
    return restarted, recovered


def test_up_restarts_a_killed_postmaster_and_its_services_resume(procs: Procs, data_dir: Path) -> None:
    up = procs.start("up", name="up")
    up.wait_for_log("Conveyor is up", timeout=90)
    assert _echo(procs, "before") is not None

    for n in (1, 2):  # twice: the second within the window waits out the backoff (0.5 s)
        _kill_postmaster_and_recover(procs, data_dir, f"after-kill-{n}")
        assert up.returncode is None, up.logs()
    assert up.stderr().count("the embedded PostgreSQL restarted") == 2, up.logs()

    up.signal(signal.SIGINT)
    assert up.wait(60) == 0, up.logs()
    until(procs, lambda: _live_postmaster(data_dir) is None, timeout=15)
    assert not (data_dir / "conveyor-up.json").exists()


def test_the_cli_says_the_database_is_restarting_while_up_runs(procs: Procs, data_dir: Path) -> None:
    up = procs.start("up", name="up")
    up.wait_for_log("Conveyor is up", timeout=90)
    old = _live_postmaster(data_dir)
    assert old is not None
    # `up` frozen at the moment its server died: the CLI finds the server down and `up` alive.
    up.signal(signal.SIGSTOP)
    try:
        os.kill(old, signal.SIGKILL)
        until(procs, lambda: not pid_alive(old), timeout=15)
        down = procs.run("executions", "list")
        assert down.returncode == 1, describe(down)
        assert f"is restarting: `conveyor up` (pid {up.pid}) runs it; try again in a moment" in down.stderr, describe(
            down
        )
        assert "start it with" not in down.stderr, describe(down)
        assert "Traceback" not in down.stderr, describe(down)
    finally:
        up.signal(signal.SIGCONT)
    until(procs, lambda: _echo(procs, "thawed"), timeout=RECOVERY_DEADLINE, interval=0.2)
    up.signal(signal.SIGINT)
    assert up.wait(60) == 0, up.logs()


def test_an_up_killed_with_sigkill_is_taken_over_by_the_next(procs: Procs, data_dir: Path) -> None:
    first = procs.start("up", name="up-1")
    first.wait_for_log("Conveyor is up", timeout=90)
    orphan = _live_postmaster(data_dir)
    assert orphan is not None
    os.kill(first.pid, signal.SIGKILL)  # `up` alone: its server runs in a session of its own
    assert first.wait(15) == -signal.SIGKILL
    assert pid_alive(orphan), "the server outlives a killed `up`"

    second = procs.start("up", name="up-2")
    second.wait_for_log("Conveyor is up", timeout=90)
    assert _live_postmaster(data_dir) == orphan, "taken over, not started beside it"
    assert _echo(procs, "taken-over") is not None

    second.signal(signal.SIGINT)  # Ctrl-C
    assert second.wait(60) == 0, second.logs()
    until(procs, lambda: not pid_alive(orphan), timeout=15)
    assert "adopting the embedded PostgreSQL left running by an earlier `conveyor up`" in second.stderr()
    # Clean: no server's lock file, and no record of a user of the server, dead or alive.
    assert not (data_dir / "postmaster.pid").exists()
    assert not (data_dir / "conveyor-up.json").exists()
    handles = data_dir / ".handle_pids.json"
    assert not handles.exists() or json.loads(handles.read_text() or "[]") == []

    # And the next `up` starts it afresh, with the data kept.
    third = procs.start("up", name="up-3")
    third.wait_for_log("Conveyor is up", timeout=90)
    assert "adopting" not in third.stderr()
    assert len(procs.json("executions", "list")) == 1
    third.signal(signal.SIGINT)
    assert third.wait(60) == 0, third.logs()
    until(procs, lambda: _live_postmaster(data_dir) is None, timeout=15)


def test_up_gives_up_on_a_server_that_keeps_dying(procs: Procs, data_dir: Path) -> None:
    env = {**procs.env, "CONVEYOR__EMBEDDED__RESTART_LIMIT": "1", "CONVEYOR__EMBEDDED__RESTART_WINDOW": "600"}
    up = procs.start("up", name="up", env=env)
    up.wait_for_log("Conveyor is up", timeout=90)
    first = _live_postmaster(data_dir)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    until(procs, lambda: _live_postmaster(data_dir) not in (None, first), timeout=RECOVERY_DEADLINE)
    second = _live_postmaster(data_dir)
    assert second is not None
    os.kill(second, signal.SIGKILL)  # the second death within the window: past restart_limit 1

    # Its services stop first, waiting out their passes' database.pool_timeout (10 s) with no server.
    assert up.wait(150) == 1, up.logs()
    assert "giving up on the embedded PostgreSQL; stopping" in up.stderr()
    last = up.stderr().rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith("error: the embedded PostgreSQL in "), up.logs()
    assert "stopped 1 times within 600 s (embedded.restart_limit 1); gave up restarting it" in last
    assert "Traceback" not in up.stderr()
    assert _live_postmaster(data_dir) in (None, second), "not started again"
    assert not (data_dir / "conveyor-up.json").exists()
