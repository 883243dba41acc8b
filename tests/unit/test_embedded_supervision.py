"""`conveyor up`'s supervision of its embedded PostgreSQL, in parts: when to restart
(domain/restarts.py), its settings, and what the CLI says when the server does not run
while an `up` does (embedded.find_running). The real processes: acceptance/test_up_supervision.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conveyor.config import Settings, load_settings
from conveyor.domain.errors import ConveyorError, DatabaseUnavailableError
from conveyor.domain.restarts import RestartPolicy, restart_delay
from conveyor.service import embedded

POLICY = RestartPolicy(limit=4, window=60.0, backoff=0.5, backoff_max=1.5)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CONVEYOR") or name in ("DATABASE_URL", "DATABASE_DIRECT_URL"):
            monkeypatch.delenv(name)


def test_the_first_restart_is_at_once_then_the_wait_doubles_up_to_its_cap() -> None:
    assert restart_delay(POLICY, [], 100.0) == 0.0
    assert restart_delay(POLICY, [99.0], 100.0) == 0.5
    assert restart_delay(POLICY, [98.0, 99.0], 100.0) == 1.0
    assert restart_delay(POLICY, [97.0, 98.0, 99.0], 100.0) == 1.5  # 2.0 capped


def test_past_the_limit_within_the_window_it_gives_up() -> None:
    assert restart_delay(POLICY, [96.0, 97.0, 98.0, 99.0], 100.0) is None


def test_restarts_older_than_the_window_do_not_count() -> None:
    assert restart_delay(POLICY, [10.0, 20.0, 30.0, 39.0], 100.0) == 0.0
    assert restart_delay(POLICY, [10.0, 20.0, 30.0, 99.0], 100.0) == 0.5


def test_a_limit_of_zero_never_restarts() -> None:
    assert restart_delay(RestartPolicy(0, 60.0, 0.5, 10.0), [], 100.0) is None


def test_settings_defaults_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = Settings().embedded
    assert (e.check_interval, e.restart_limit, e.restart_window, e.restart_backoff, e.restart_backoff_max) == (
        0.5,
        5,
        60.0,
        0.5,
        10.0,
    )
    monkeypatch.setenv("CONVEYOR__EMBEDDED__RESTART_LIMIT", "2")
    assert load_settings(None).settings.embedded.restart_limit == 2


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("embedded:\n  check_interval: 0\n", "embedded.check_interval"),
        ("embedded:\n  restart_limit: -1\n", "embedded.restart_limit"),
        ("embedded:\n  restart_backoff: 5\n  restart_backoff_max: 1\n", "restart_backoff_max"),
    ],
)
def test_bad_values_are_refused_in_one_line(tmp_path: Path, yaml: str, message: str) -> None:
    path = tmp_path / "conveyor.yaml"
    path.write_text(yaml)
    with pytest.raises(ConveyorError) as caught:
        load_settings(path)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# -- what the CLI says ---------------------------------------------------------------------


def _settings(pgdata: Path) -> Settings:
    return Settings(embedded={"data_dir": str(pgdata)})  # type: ignore[arg-type]


def _owners(pgdata: Path, *owners: tuple[int, float, str]) -> None:
    pgdata.mkdir(exist_ok=True)
    (pgdata / embedded.OWNERS).write_text(json.dumps([{"pid": p, "started": s, "state": st} for p, s, st in owners]))


def _me() -> tuple[int, float]:
    return os.getpid(), psutil.Process().create_time()


@pytest.mark.parametrize("state", ["restarting", "running"])
def test_while_up_runs_a_server_that_is_down_is_restarting(tmp_path: Path, state: str) -> None:
    pid, started = _me()
    _owners(tmp_path / "pgdata", (pid, started, state))
    with pytest.raises(DatabaseUnavailableError) as caught:
        embedded.find_running(_settings(tmp_path / "pgdata"))
    message = str(caught.value)
    assert f"is restarting: `conveyor up` (pid {pid}) runs it; try again in a moment" in message
    assert "start it with" not in message


def test_while_up_starts_it_is_starting(tmp_path: Path) -> None:
    pid, started = _me()
    _owners(tmp_path / "pgdata", (pid, started, "starting"))
    with pytest.raises(DatabaseUnavailableError, match="is starting: `conveyor up`"):
        embedded.find_running(_settings(tmp_path / "pgdata"))


def test_a_dead_up_or_a_reused_pid_is_no_up(tmp_path: Path) -> None:
    pid, started = _me()
    # This process, but not started then: the pid of a dead `up`, reused.
    _owners(tmp_path / "pgdata", (pid, started - 100, "running"))
    with pytest.raises(DatabaseUnavailableError, match="start it with `conveyor up`"):
        embedded.find_running(_settings(tmp_path / "pgdata"))


def test_a_postmaster_pid_being_written_is_not_a_traceback(tmp_path: Path) -> None:
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / "postmaster.pid").write_text(f"{os.getpid()}\n{pgdata}\n")  # the first lines only
    with pytest.raises(DatabaseUnavailableError, match="start it with `conveyor up`"):
        embedded.find_running(_settings(pgdata))


def test_a_postmaster_pid_naming_a_zombie_is_no_server(tmp_path: Path) -> None:
    # A killed postmaster is a zombie until its parent reaps it: it is not a server.
    child = subprocess.Popen(["true"])  # exits, and is not waited for: a zombie
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        pgdata = tmp_path / "pgdata"
        pgdata.mkdir()
        lines = [str(child.pid), str(pgdata), "1700000000", "5432", str(pgdata), "", "1 2", "ready"]
        (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")
        with pytest.raises(DatabaseUnavailableError, match="is not running"):
            embedded.find_running(_settings(pgdata))
    finally:
        child.wait()


def test_a_reused_pid_in_pgserver_s_old_list_of_users_is_no_user(tmp_path: Path) -> None:
    # .handle_pids.json, written by `up`s of earlier releases, holds bare pids: this process
    # (pytest, no `conveyor up`) stands for a dead `up`'s pid reused by something else.
    from conveyor.service.embedded_server import LEGACY_HANDLES, _legacy_users

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / LEGACY_HANDLES).write_text(json.dumps([sleeper.pid, 2**22 + 1]))
        assert _legacy_users(tmp_path) == []
        assert not (tmp_path / LEGACY_HANDLES).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
