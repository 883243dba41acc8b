"""Helpers for acceptance tests: start real ``conveyor`` processes, run CLI commands,
and poll with a deadline (never a fixed sleep) until something becomes true.
``eventually`` and ``stays`` are support.polling's, re-exported here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from support.polling import GiveUp, eventually
from support.polling import stays as stays  # re-exported: the acceptance modules import it from here

CONVEYOR = [sys.executable, "-m", "conveyor"]

# Short intervals so that the suite is quick; every wait below still polls with a deadline.
FAST_SETTINGS = {
    "CONVEYOR__WORKER__HEARTBEAT_INTERVAL": "1",
    "CONVEYOR__WORKER__POLL_INTERVAL": "0.2",
    "CONVEYOR__EXECUTOR__POLL_INTERVAL": "0.2",
    "CONVEYOR__WORKER__SHUTDOWN_TIMEOUT": "5",
    "CONVEYOR__WORKER__KILL_GRACE": "2",
    # `conveyor up` serves the API: on a free port of the kernel's choosing, so tests never
    # fight over 8080 (a test that needs to reach it sets its own).
    "CONVEYOR__API__PORT": "0",
    "CONVEYOR__API__HOST": "127.0.0.1",
}

T = TypeVar("T")

_LOG_TAIL = 20_000


def conveyor_env(database_url: str | None, **overrides: object) -> dict[str, str]:
    """The environment of a conveyor process: ours minus any inherited Conveyor settings,
    plus the fast settings, ``DATABASE_URL`` (unless None) and ``overrides``."""
    urls = ("DATABASE_URL", "DATABASE_DIRECT_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR") and k not in urls}
    env.update(FAST_SETTINGS)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def until(procs: Procs, fn: Callable[[], T], timeout: float = 20.0, interval: float = 0.05) -> T:
    """``eventually``, failing with the logs of every process the test started."""
    return eventually(fn, timeout=timeout, interval=interval, message=procs.logs)


def run_cli(
    *args: str, env: Mapping[str, str], timeout: float = 60.0, cwd: str | Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one ``conveyor`` command to completion and capture its output."""
    return subprocess.run(
        [*CONVEYOR, *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        check=False,
    )


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"$ conveyor {' '.join(result.args[len(CONVEYOR) :])}\nexit code {result.returncode}\n"
        f"--- stdout ---\n{result.stdout[-_LOG_TAIL:]}\n--- stderr ---\n{result.stderr[-_LOG_TAIL:]}"
    )


def cli_json(*args: str, env: Mapping[str, str], timeout: float = 60.0) -> Any:
    """Run a command that prints JSON (``--json`` is added), assert it succeeded, parse it."""
    result = run_cli(*args, "--json", env=env, timeout=timeout)
    assert result.returncode == 0, describe(result)
    return json.loads(result.stdout)


class Proc:
    """A long-running ``conveyor`` process with its stdout and stderr in files."""

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str],
        log_dir: Path,
        name: str,
        cwd: str | Path | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        """``prefix`` wraps the command (e.g. ``ip netns exec NS``, which execs it: same pid)."""
        self.args = args
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                [*prefix, *CONVEYOR, *args],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                cwd=cwd,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def logs(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return (
            f"=== {self.name} (pid {self.pid}, {state}): conveyor {' '.join(self.args)}\n"
            f"--- stdout ---\n{self.stdout()[-_LOG_TAIL:]}\n--- stderr ---\n{self.stderr()[-_LOG_TAIL:]}"
        )

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Wait until ``text`` appears in stdout or stderr; fail at once if the process exits.
        The default bound is generous on purpose: a process starting beside three other test
        processes on two cores took over 20 s to log that it was up (a cold import of the web
        stack under that load); a process that dies fails at once anyway."""

        def logged() -> bool:
            if text in self.stderr() or text in self.stdout():
                return True
            if self.returncode is not None:
                raise GiveUp(f"{self.name} exited before logging {text!r}\n{self.logs()}")
            return False

        eventually(
            logged, timeout, 0.05, lambda: f"{self.name} did not log {text!r} within {timeout:g}s\n{self.logs()}"
        )

    def signal(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code; AssertionError (with the logs) if still running after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout:g}s\n{self.logs()}") from None

    def kill(self) -> None:
        """SIGKILL the process and everything in its process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


class Procs:
    """Every process a test started: killed at teardown, their logs printed (pytest shows
    output captured during teardown when the test failed)."""

    def __init__(self, log_dir: Path, env: Mapping[str, str]) -> None:
        self.log_dir = log_dir
        self.env = dict(env)
        self.started: list[Proc] = []

    def start(
        self, *args: str, name: str | None = None, env: Mapping[str, str] | None = None, cwd: str | Path | None = None
    ) -> Proc:
        label = name or f"{len(self.started):02d}-{args[0]}"
        proc = Proc(list(args), env if env is not None else self.env, self.log_dir, label, cwd=cwd)
        self.started.append(proc)
        return proc

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env if env is not None else self.env, timeout=timeout)

    def json(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Any:
        return cli_json(*args, env=env if env is not None else self.env, timeout=timeout)

    def logs(self) -> str:
        return "\n".join(p.logs() for p in self.started)

    def close(self) -> None:
        for proc in self.started:
            proc.kill()
        if self.started:
            print(self.logs())


def processes_with_argv(argv: list[str]) -> list[int]:
    """Pids of live processes whose command line is exactly ``argv`` (like ``pgrep -fx``)."""
    wanted = ("\0".join(argv) + "\0").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() == wanted:
                found.append(int(entry.name))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0; it is not running any more.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def postmaster_pid(data_dir: Path) -> int | None:
    """The pid a PostgreSQL data directory's lock file names (alive or not), or None."""
    try:
        first = (data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
    except FileNotFoundError:
        return None
    return int(first) if first.strip().isdigit() else None
