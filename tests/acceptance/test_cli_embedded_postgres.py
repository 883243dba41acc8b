"""Acceptance: ``conveyor up`` with the embedded PostgreSQL, used as a user would: it
starts its own server, runs work, and leaves no server behind when it stops."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from acceptance.helpers import (
    Procs,
    conveyor_env,
    describe,
    eventually,
    pid_alive,
    postmaster_pid,
)

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


# -- 9. the embedded PostgreSQL ----------------------------------------------------------------


def _server_gone(data_dir: Path) -> bool:
    pid = postmaster_pid(data_dir)
    return pid is None or not pid_alive(pid)


def test_up_with_embedded_postgres(procs: Procs) -> None:
    # Not under pytest's tmp_path: its parents are 0700, and as root the server runs as
    # the OS user `pgserver`, which must be able to reach its data directory.
    base = Path(tempfile.mkdtemp(prefix="conveyor-acc-embedded-", dir="/tmp"))
    base.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    data_dir = base / "pgdata"
    env = conveyor_env(None, CONVEYOR__EMBEDDED__DATA_DIR=data_dir)
    try:
        up = procs.start("up", name="up-embedded-1", env=env)
        up.wait_for_log("Conveyor is up", timeout=60)
        assert postmaster_pid(data_dir) is not None

        waited = procs.run("run", "core.echo", "message=embedded", "--wait", env=env)
        assert waited.returncode == 0, describe(waited)
        assert "embedded" in waited.stdout
        assert waited.stderr == "", "nothing but the result for the user"
        first = procs.json("executions", "list", env=env)  # summaries: a preview of the parameters
        assert [(e["action_ref"], e["status"], e["parameters_preview"]) for e in first] == [
            ("core.echo", "completed", '{"message": "embedded"}')
        ]

        # The embedded database is reachable by hand while `up` runs: its URL, psql (on
        # the URL alone, as a user would), and which migrations it has.
        url = procs.run("db", "url", env=env)
        assert url.returncode == 0, describe(url)
        assert url.stdout.startswith("postgresql://"), describe(url)
        counted = procs.run("psql", "-At", "-c", "SELECT count(*) FROM execution", env=env)
        assert counted.returncode == 0, describe(counted)
        assert counted.stdout == "1\n", describe(counted)
        assert procs.json("migrate", "--status", env=env)["pending"] == []

        up.signal(signal.SIGTERM)
        assert up.wait(30) == 0, up.logs()
        eventually(lambda: _server_gone(data_dir), timeout=15, message=up.logs)

        # Commands other than `up` do not start the server: they say how to get one.
        for command in (["executions", "list"], ["db", "url"], ["psql"]):
            offline = procs.run(*command, env=env)
            assert offline.returncode == 1, describe(offline)
            assert "start it with `conveyor up`" in offline.stderr, describe(offline)
            assert "Traceback" not in offline.stderr

        # The data outlives the server.
        again = procs.start("up", name="up-embedded-2", env=env)
        again.wait_for_log("Conveyor is up", timeout=60)
        assert [e["id"] for e in procs.json("executions", "list", env=env)] == [first[0]["id"]]
        again.signal(signal.SIGTERM)
        assert again.wait(30) == 0, again.logs()
        eventually(lambda: _server_gone(data_dir), timeout=15, message=again.logs)
    finally:
        procs.close()
        procs.started.clear()
        pid = postmaster_pid(data_dir)
        if pid is not None and pid_alive(pid):  # a failed run must not leave a server behind
            os.kill(pid, signal.SIGQUIT)
            eventually(lambda: not pid_alive(pid), timeout=15)
        shutil.rmtree(base, ignore_errors=True)
