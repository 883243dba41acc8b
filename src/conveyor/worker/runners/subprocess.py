"""Run a subprocess action: argv without a shell (or ``/bin/sh -c`` when the action says so),
parameters as JSON on stdin, bounded output capture, and a timeout that kills the whole
process group.

Uses the loop's low-level ``subprocess_exec`` (what ``asyncio.create_subprocess_exec`` wraps)
because it exposes the transport publicly: the runner must be able to close the pipes and stop
reading when a process outside its control still holds them open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conveyor.domain.models import ActionResult
from conveyor.domain.storable import ERROR_LIMIT, Unstorable, clean_text, output_text, stored_value

# After the group is SIGKILLed, how long to wait for the exit status and what is still in the pipes.
_AFTER_KILL = 0.5
_STDOUT, _STDERR = 1, 2


class _Capture(asyncio.SubprocessProtocol):
    """Keeps the first ``limit`` bytes of stdout and stderr and discards the rest. It never
    pauses reading, so a chatty child can never block on a full pipe."""

    def __init__(self, limit: int, on_output: Callable[[str, bytes], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.limit = limit
        self.on_output = on_output  # the bytes kept, as they come (live output)
        self.output = {_STDOUT: bytearray(), _STDERR: bytearray()}
        self.truncated = {_STDOUT: False, _STDERR: False}
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof = {_STDOUT: loop.create_future(), _STDERR: loop.create_future()}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        buf = self.output[fd]
        room = self.limit - len(buf)
        if len(data) > room:
            self.truncated[fd] = True
            data = data[: max(room, 0)]
        buf += data
        if data and self.on_output is not None:
            self.on_output("stdout" if fd == _STDOUT else "stderr", data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        future = self.eof.get(fd)
        if future is not None and not future.done():
            future.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    @property
    def pending(self) -> set[asyncio.Future[None]]:
        """What is not finished yet: the process itself and the pipes something still holds open."""
        return {f for f in (self.exited, *self.eof.values()) if not f.done()}

    def text(self, fd: int) -> tuple[str, str]:
        """The output as stored, with its encoding (``utf-8``, or ``base64`` for bytes that
        are not UTF-8 text or hold a NUL)."""
        return output_text(bytes(self.output[fd]), self.truncated[fd])


_GUARD = str(Path(__file__).with_name("guard.py"))


def _argv(metadata: dict[str, Any], parameters: dict[str, Any]) -> list[str]:
    if metadata.get("shell"):
        name = metadata.get("command_parameter")
        command = parameters.get(name) if isinstance(name, str) else None
        if not isinstance(command, str) or not command:
            raise ValueError(f"shell action needs a non-empty string in parameter {name!r}")
        return ["/bin/sh", "-c", command]
    argv = metadata.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("action metadata has no argv (a non-empty list of strings)")
    return argv


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    # Already gone (EPERM is what some systems report for a group of zombies).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _terminate(pgid: int, capture: _Capture, grace: float) -> None:
    """SIGTERM the group, give it ``grace`` seconds, then SIGKILL it.

    The SIGKILL is in ``finally`` so that a cancellation arriving during the grace period still
    cannot leave the group running. It is skipped when the leader has exited and nothing holds
    our pipes any more: the group is then (almost certainly) empty, and its id could already
    belong to a new process group.
    """
    if not capture.pending:
        return
    _signal_group(pgid, signal.SIGTERM)
    try:
        await asyncio.wait(capture.pending, timeout=grace)
    finally:
        if capture.pending:
            _signal_group(pgid, signal.SIGKILL)


async def _stop_started(start: asyncio.Future[tuple[asyncio.SubprocessTransport, _Capture]], grace: float) -> None:
    """A run cancelled while its process was starting: let the start finish, then stop the
    whole group. (Cancelled before asyncio has connected the pipes, the start's own clean-up
    kills the leader alone and then waits for every pipe to close -- which the rest of the
    group holds open: the group ran on, and the cancellation waited for it to end by itself;
    100 s of a ``sleep 100`` in a loaded CI run.)"""
    try:
        transport, capture = await asyncio.shield(start)
    except (OSError, ValueError):
        return  # it did not start: nothing runs
    try:
        await _terminate(transport.get_pid(), capture, grace)
    finally:
        transport.close()


def _failure(exit_code: int | None) -> str | None:
    if exit_code is None:
        return "no exit status"
    if exit_code < 0:
        return f"killed by signal {-exit_code}"
    return None if exit_code == 0 else f"exit code {exit_code}"


async def run_subprocess(
    metadata: dict[str, Any],
    parameters: dict[str, Any],
    *,
    timeout: float,  # noqa: ASYNC109 - on timeout the group is killed and a result returned
    kill_grace: float,
    output_limit: int,
    on_output: Callable[[str, bytes], None] | None = None,
) -> ActionResult:
    """Run the command an action's metadata describes and never raise (except on cancellation,
    which kills the process group before propagating).

    The run ends when the process exits and its pipes are closed. If the process exits but
    something it started keeps the pipes open, that straggler gets ``kill_grace`` seconds, then
    the group is SIGKILLed and reading stops; the result is the process's own exit status.
    """
    started = time.monotonic()

    def failed(error: str) -> ActionResult:
        error = clean_text(error, ERROR_LIMIT)  # it may quote the command or a parameter
        return ActionResult(succeeded=False, exit_code=None, duration=time.monotonic() - started, error=error)

    try:
        argv = _argv(metadata, parameters)
    except ValueError as e:
        return failed(str(e))
    feed_json = metadata.get("stdin", "json") == "json"
    stdin_data = json.dumps(parameters).encode() if feed_json else b""

    if sys.platform == "linux" and shutil.which(argv[0]):
        # Started through the group guard: if the worker dies (SIGKILL, OOM), its whole
        # process group is killed, since the execution is recovered elsewhere.
        argv = [sys.executable, "-I", _GUARD, *argv]
    start = asyncio.ensure_future(
        asyncio.get_running_loop().subprocess_exec(
            lambda: _Capture(output_limit, on_output),
            *argv,
            stdin=subprocess.PIPE if feed_json else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout can kill all of it
        )
    )
    try:
        transport, capture = await asyncio.shield(start)
    except (OSError, ValueError) as e:  # not found, not executable, NUL byte in an argument
        return failed(f"cannot start {argv[0]!r}: {getattr(e, 'strerror', None) or e}")
    except asyncio.CancelledError:
        await _stop_started(start, kill_grace)
        raise

    pgid = transport.get_pid()  # start_new_session makes the child its group's leader
    timed_out = False
    try:
        if feed_json:
            # Buffered by the transport and flushed as the child reads: never blocks the runner.
            # A child that exits without reading just leaves the write to fail quietly.
            stdin = transport.get_pipe_transport(0)
            assert isinstance(stdin, asyncio.WriteTransport)
            stdin.write(stdin_data)
            stdin.close()

        await asyncio.wait({capture.exited}, timeout=max(started + timeout - time.monotonic(), 0))
        if not capture.exited.done():
            timed_out = True
            await _terminate(pgid, capture, kill_grace)
        elif capture.pending:  # exited, but its pipes are still held open by a straggler
            await asyncio.wait(capture.pending, timeout=kill_grace)
            if capture.pending:
                _signal_group(pgid, signal.SIGKILL)
        if capture.pending:
            await asyncio.wait(capture.pending, timeout=_AFTER_KILL)
    except asyncio.CancelledError:
        await _terminate(pgid, capture, kill_grace)
        raise
    finally:
        transport.close()  # stop reading whatever is left; kills the leader if it is still alive

    exit_code = transport.get_returncode()
    data: Any = None
    data_truncated = False
    error = f"timed out after {timeout:g}s" if timed_out else _failure(exit_code)
    stdout, stdout_encoding = capture.text(_STDOUT)
    stderr, stderr_encoding = capture.text(_STDERR)
    if metadata.get("output") == "json":
        try:
            # From the bytes: JSON is UTF-8, and output that is not is not JSON.
            data, data_truncated = stored_value(json.loads(bytes(capture.output[_STDOUT])), output_limit)
        except Unstorable as e:
            data, error = None, error or clean_text(f"stdout is JSON that cannot be stored: {e}")
        except (ValueError, RecursionError) as e:
            # A failed command's output is a bonus, not a second error.
            error = error or clean_text(f"stdout is not valid JSON: {e}", 500)
    return ActionResult(
        succeeded=error is None,
        exit_code=exit_code,
        duration=time.monotonic() - started,
        stdout=stdout,
        stderr=stderr,
        data=data,
        error=error,
        stdout_truncated=capture.truncated[_STDOUT],
        stderr_truncated=capture.truncated[_STDERR],
        timed_out=timed_out,
        stdout_encoding=stdout_encoding,
        stderr_encoding=stderr_encoding,
        data_truncated=data_truncated,
    )
