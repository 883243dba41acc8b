"""The subprocess and Python action runners."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor.actions.core import core
from conveyor.actions.registry import ActionDefinition
from conveyor.worker.runners import run_python, run_subprocess
from support.polling import eventually, until

PY = sys.executable
LIMIT = 64 * 1024


def argv_meta(*argv: str, output: str = "text", stdin: str = "json") -> dict[str, Any]:
    return {"argv": list(argv), "shell": False, "command_parameter": None, "output": output, "stdin": stdin}


LOCAL = core.get("core.local").metadata  # type: ignore[union-attr]


async def run(metadata: dict[str, Any], parameters: dict[str, Any], **kw: Any) -> Any:
    options: dict[str, Any] = {"timeout": 5.0, "kill_grace": 0.5, "output_limit": LIMIT, **kw}
    return await run_subprocess(metadata, parameters, **options)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed orphan may linger as a zombie if nothing reaps it here; it is dead all the same.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# A shell that starts a grandchild, publishes "leader grandchild" pids atomically, then waits.
def spawner(pidfile: Path, prefix: str = "") -> str:
    return f'{prefix}sleep 100 & echo "$$ $!" > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; wait'


def pids(pidfile: Path) -> list[int]:
    return [int(p) for p in pidfile.read_text().split()]


# --- subprocess runner -------------------------------------------------------------------------


async def test_argv_runs_without_shell_and_parameters_arrive_on_stdin() -> None:
    nasty = "a; rm -rf /nonexistent $(echo pwned) `id`"
    code = "import sys, json; print(json.load(sys.stdin)['x'])"
    result = await run(argv_meta(PY, "-c", code), {"x": nasty})
    assert result.succeeded, result
    assert (result.exit_code, result.error, result.data) == (0, None, None)
    assert result.stdout == nasty + "\n"
    assert result.duration > 0


async def test_argv_elements_are_passed_literally() -> None:
    result = await run(argv_meta("printf", "%s", "; echo pwned $HOME"), {})
    assert result.stdout == "; echo pwned $HOME"


async def test_shell_through_core_local_with_stdin_closed() -> None:
    # `cat` would wait forever on an open stdin pipe; core.local gives it /dev/null.
    result = await run(LOCAL, {"cmd": "cat; echo $((1 + 2)) | tr 3 x"})
    assert result.succeeded
    assert result.stdout == "x\n"


async def test_shell_without_command_parameter_is_an_error_result() -> None:
    result = await run(LOCAL, {})
    assert not result.succeeded
    assert result.exit_code is None
    assert "cmd" in (result.error or "")


async def test_json_output_is_parsed() -> None:
    code = "import sys, json; p = json.load(sys.stdin); print(json.dumps({'sum': p['a'] + p['b']}))"
    result = await run(argv_meta(PY, "-c", code, output="json"), {"a": 1, "b": 2})
    assert result.succeeded
    assert result.data == {"sum": 3}


async def test_invalid_json_output_fails() -> None:
    result = await run(argv_meta("printf", "not json", output="json"), {})
    assert not result.succeeded
    assert result.exit_code == 0
    assert result.data is None
    assert (result.error or "").startswith("stdout is not valid JSON: ")
    assert result.stdout == "not json"


async def test_non_zero_exit() -> None:
    result = await run(LOCAL, {"cmd": "echo out; echo oops >&2; exit 3"})
    assert not result.succeeded
    assert (result.exit_code, result.error) == (3, "exit code 3")
    assert (result.stdout, result.stderr) == ("out\n", "oops\n")
    assert not result.timed_out


async def test_failed_json_command_reports_exit_code_not_json() -> None:
    result = await run(argv_meta("sh", "-c", "echo nope; exit 2", output="json"), {})
    assert result.error == "exit code 2"


async def test_output_is_truncated_at_the_limit_and_the_rest_drained() -> None:
    code = "import sys; sys.stdout.write('o' * 1_000_000); sys.stderr.write('e' * 1_000_000)"
    result = await run(argv_meta(PY, "-c", code, stdin="none"), {}, output_limit=1024)
    assert result.succeeded  # the child was never blocked on a full pipe
    assert result.stdout == "o" * 1024
    assert result.stderr == "e" * 1024
    assert result.stdout_truncated
    assert result.stderr_truncated


async def test_output_at_the_limit_is_not_truncated() -> None:
    result = await run(argv_meta("printf", "%s", "x" * 1024), {}, output_limit=1024)
    assert result.stdout == "x" * 1024
    assert not result.stdout_truncated
    assert not result.stderr_truncated


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = await run(LOCAL, {"cmd": spawner(pidfile)}, timeout=0.5, kill_grace=0.5)
    assert time.monotonic() - started < 2
    assert result.timed_out
    assert not result.succeeded
    assert result.error == "timed out after 0.5s"
    assert result.exit_code is not None
    assert result.exit_code < 0
    for pid in pids(pidfile):
        await until(lambda pid=pid: not alive(pid), timeout=2.0, interval=0.01)  # type: ignore[misc]


async def test_term_ignoring_group_is_killed_after_the_grace(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    # The ignored SIGTERM is inherited by the grandchild too.
    result = await run(LOCAL, {"cmd": spawner(pidfile, prefix='trap "" TERM; ')}, timeout=0.3, kill_grace=0.3)
    assert result.timed_out
    assert result.exit_code == -9
    assert 0.6 <= result.duration < 2
    for pid in pids(pidfile):
        await until(lambda pid=pid: not alive(pid), timeout=2.0, interval=0.01)  # type: ignore[misc]


async def test_exited_command_whose_grandchild_holds_stdout_is_not_waited_for(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cmd = f"sleep 100 & echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; echo started"
    result = await run(LOCAL, {"cmd": cmd}, timeout=5, kill_grace=0.2)
    assert result.succeeded
    assert not result.timed_out
    assert result.stdout == "started\n"
    assert result.duration < 2
    await until(lambda: not alive(pids(pidfile)[0]), timeout=2.0, interval=0.01)


async def test_cancellation_kills_the_process_group_and_propagates(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    task = asyncio.create_task(run(LOCAL, {"cmd": spawner(pidfile)}, timeout=30, kill_grace=0.5))
    await until(pidfile.exists, timeout=2.0, interval=0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid in pids(pidfile):
        await until(lambda pid=pid: not alive(pid), timeout=2.0, interval=0.01)  # type: ignore[misc]


async def test_cancellation_while_the_process_starts_kills_the_process_group(tmp_path: Path) -> None:
    # Cancelled after the process started but before asyncio connected its pipes (a loaded
    # machine): asyncio's own clean-up killed the leader alone and waited for the pipes,
    # which the rest of the group held open -- the cancellation took as long as the group
    # ran (100 s of `sleep 100` in a CI run), and the group was not stopped by it.
    pidfile = tmp_path / "pids"
    before = {p.pid for p in psutil.Process().children()}
    task = asyncio.create_task(run(LOCAL, {"cmd": spawner(pidfile)}, timeout=30, kill_grace=0.5))
    for _ in range(100):  # one step at a time, until the process exists
        await asyncio.sleep(0)
        if {p.pid for p in psutil.Process().children()} - before:
            break
    # Blocking on purpose: the loop must not run on (and connect the pipes) meanwhile.
    eventually(pidfile.exists, timeout=10.0, interval=0.01)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10.0)
    assert done, "the cancellation waited for the process group to end by itself"
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid in pids(pidfile):
        await until(lambda pid=pid: not alive(pid), timeout=2.0, interval=0.01)  # type: ignore[misc]


async def test_command_not_found() -> None:
    result = await run(argv_meta("/nonexistent/conveyor-no-such-command"), {})
    assert not result.succeeded
    assert result.exit_code is None
    assert result.error == "cannot start '/nonexistent/conveyor-no-such-command': No such file or directory"


async def test_permission_denied(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = await run(argv_meta(str(script)), {})
    assert result.exit_code is None
    assert (result.error or "").endswith(": Permission denied")


async def test_missing_argv_is_an_error_result() -> None:
    result = await run({"shell": False, "argv": []}, {})
    assert not result.succeeded
    assert "argv" in (result.error or "")


# --- python runner -----------------------------------------------------------------------------


def definition(func: Callable[..., Any] | None) -> ActionDefinition:
    return ActionDefinition(ref="tests.action", runner_type="python", runtime="python", parameters_schema={}, func=func)


async def test_python_sync_action() -> None:
    result = await run_python(core.get("core.echo"), {"message": "hi"}, timeout=5)  # type: ignore[arg-type]
    assert result.succeeded
    assert (result.exit_code, result.data, result.error) == (0, "hi", None)


async def test_python_sync_action_runs_in_the_given_pool() -> None:
    def where() -> str:
        return threading.current_thread().name

    with concurrent.futures.ThreadPoolExecutor(thread_name_prefix="runner-test") as pool:
        result = await run_python(definition(where), {}, timeout=5, executor=pool)
    assert result.data.startswith("runner-test")


async def test_python_async_action() -> None:
    result = await run_python(core.get("core.sleep"), {"seconds": 0.01}, timeout=5)  # type: ignore[arg-type]
    assert result.succeeded
    assert result.data == 0.01


async def test_python_exception_becomes_a_failed_result_with_traceback() -> None:
    def boom(n: int) -> None:
        raise ValueError(f"bad {n}")

    result = await run_python(definition(boom), {"n": 7}, timeout=5)
    assert not result.succeeded
    assert (result.exit_code, result.error) == (1, "ValueError: bad 7")
    assert result.stderr.startswith("Traceback")
    assert 'raise ValueError(f"bad {n}")' in result.stderr


async def test_python_sys_exit_does_not_escape() -> None:
    def leave() -> None:
        sys.exit(4)

    result = await run_python(definition(leave), {}, timeout=5)
    assert (result.succeeded, result.error) == (False, "SystemExit: 4")


async def test_python_async_timeout() -> None:
    async def slow() -> None:
        await asyncio.sleep(10)

    result = await run_python(definition(slow), {}, timeout=0.1)
    assert result.timed_out
    assert not result.succeeded
    assert (result.exit_code, result.error) == (None, "timed out after 0.1s")
    assert result.duration < 1


async def test_python_actions_own_timeout_error_is_a_failure_not_a_timeout() -> None:
    async def fails() -> None:
        raise TimeoutError("upstream")

    result = await run_python(definition(fails), {}, timeout=5)
    assert not result.timed_out
    assert result.error == "TimeoutError: upstream"


async def test_python_sync_timeout_leaves_the_thread_running() -> None:
    release = threading.Event()
    finished = threading.Event()

    def stuck() -> str:
        release.wait(5)
        finished.set()
        return "late"

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        result = await run_python(definition(stuck), {}, timeout=0.1, executor=pool)
        assert result.timed_out
        assert result.error == "timed out after 0.1s"
        assert not finished.is_set()  # it cannot be killed; it finishes in the background
        release.set()
    assert finished.is_set()


async def test_python_cancellation_propagates() -> None:
    async def slow() -> None:
        await asyncio.sleep(10)

    task = asyncio.create_task(run_python(definition(slow), {}, timeout=5))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_python_return_value_is_stored_as_json() -> None:
    result = await run_python(definition(lambda: {1: (1, 2)}), {}, timeout=5)
    assert result.data == {"1": [1, 2]}


async def test_python_value_that_is_not_json_fails_the_run_with_the_reason() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    result = await run_python(definition(Thing), {}, timeout=5)
    assert not result.succeeded
    assert result.data is None
    assert result.error == (
        "the returned value cannot be stored: it has no JSON form (Object of type Thing is not JSON serializable)"
    )
    result = await run_python(definition(lambda: float("nan")), {}, timeout=5)
    assert not result.succeeded
    assert result.error is not None
    assert "Out of range float values are not JSON compliant" in result.error


async def test_python_action_without_code() -> None:
    result = await run_python(definition(None), {}, timeout=5)
    assert not result.succeeded
    assert result.error == "action has no Python code on this worker"
