"""Run a Python action isolated in a child process the worker can kill (``isolation="process"``).

A sync action in a thread of the worker cannot be stopped: when its execution is cancelled,
times out, or is recovered elsewhere because the worker lost its standing, the thread runs
on beside the re-run. A child process can be killed: cancel, timeout, self-fence, lost
standing and shutdown SIGTERM it, and SIGKILL it after ``kill_grace``. And it stops itself
when the worker cannot (a frozen host, a hung worker): it holds a lease the worker renews
with each heartbeat (runners/child.py).

Start method: ``forkserver``. The worker runs an event loop and threads, and forking such a
process is unsafe (a lock held by another thread at the fork stays locked forever in the
child). ``spawn`` starts a new interpreter and imports Conveyor and the action's module for
every run (hundreds of milliseconds). The fork server is a single-threaded process started
once, with the actions' modules imported in advance: each run is a fork of it, a few
milliseconds (docs/deployment.md has the figure measured).

The child's messages (``ctx.log()`` lines, then the result) come over a pipe read by a
thread of its own, so a large result never holds the event loop while it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.context import ForkServerContext
from typing import Any

from conveyor.actions.context import current
from conveyor.actions.registry import ActionDefinition
from conveyor.domain.models import ActionResult
from conveyor.domain.storable import ERROR_LIMIT, OUTPUT_LIMIT, Unstorable, capped_text, clean_text, stored_value
from conveyor.worker.runners import child

_AFTER_KILL = 2.0  # after SIGKILL, how long to wait for the exit status

_ctx: ForkServerContext = multiprocessing.get_context("forkserver")
# Preloading anything also hands the fork server this process's sys.path: actions are found
# where the worker finds them. "__main__": a main *script* (not ``-m conveyor``) is imported
# once by the fork server, instead of again by every child (tens of milliseconds each).
_PRELOAD = ("__main__", "conveyor.worker.runners.child")
_ctx.set_forkserver_preload(list(_PRELOAD))


class Lease:
    """The deadline (CLOCK_MONOTONIC seconds) past which every child of this worker stops
    itself; one shared double, written by the worker's liveness, read by the children."""

    def __init__(self, span: float) -> None:
        self.span = span  # self_fence_after: renewed to now + span after each heartbeat
        self.deadline: Any = _ctx.RawValue("d", time.monotonic() + span)

    def renew(self, last_ok: float) -> None:
        self.deadline.value = last_ok + self.span

    def expire(self) -> None:
        """The worker lost its standing: every child stops now, without a grace."""
        self.deadline.value = 0.0


def preload(modules: Iterable[str]) -> None:
    """Modules the fork server imports once, before forking any child (the actions' own)."""
    _ctx.set_forkserver_preload([*_PRELOAD, *sorted(set(modules) - set(_PRELOAD))])


def warm_up() -> None:
    """Start the fork server now (blocking, a few hundred milliseconds: run it in a thread),
    not at the first isolated run."""
    from multiprocessing import forkserver

    forkserver.ensure_running()


def entry_point(definition: ActionDefinition) -> str | None:
    """``module:qualname`` of the action's function when a child can import it by that name."""
    name = definition.metadata.get("entry_point")
    if not isinstance(name, str) or "<locals>" in name or name.startswith("__main__:"):
        return None
    return name


class _Child:
    """A started child, the thread reading its pipe and the one waiting for its exit."""

    def __init__(self, on_log: Callable[[str, bytes], None] | None) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.on_log = on_log
        self.outcome: asyncio.Future[tuple[Any, ...]] = loop.create_future()
        self.exited: asyncio.Future[int | None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()  # the pipe's end: every message read
        self.process: multiprocessing.process.BaseProcess | None = None

    def start(self, target_args: tuple[Any, ...]) -> None:
        """Blocking (the fork server is asked over a socket): called in a thread."""
        reader, writer = _ctx.Pipe(duplex=False)
        process = _ctx.Process(target=child.main, args=(writer, *target_args), daemon=False, name="conveyor-action")
        try:
            process.start()
        except BaseException:
            reader.close()
            raise
        finally:
            writer.close()  # the child holds the only write end: its death is our EOF
        self.process = process
        threading.Thread(target=self._read, args=(reader,), name="conveyor-action-pipe", daemon=True).start()
        # Its exit is watched apart from the pipe: a process the action forked may hold the
        # pipe open after the child is gone.
        threading.Thread(target=self._wait, name="conveyor-action-wait", daemon=True).start()

    def _read(self, reader: Any) -> None:
        try:
            while True:
                message = reader.recv()
                self._post(self._message, message)
        except (EOFError, OSError):
            pass
        finally:
            reader.close()
            self._post(self._drained, None)

    def _wait(self) -> None:
        assert self.process is not None
        self.process.join()
        self._post(self._exit, self.process.exitcode)

    def _post(self, fn: Callable[[Any], None], arg: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
            self.loop.call_soon_threadsafe(fn, arg)

    def _message(self, message: tuple[Any, ...]) -> None:
        if message[0] == "log":
            if self.on_log is not None:
                self.on_log(message[1], message[2])
        elif not self.outcome.done():
            self.outcome.set_result(message)

    def _drained(self, _: None) -> None:
        if not self.drained.done():
            self.drained.set_result(None)

    def _exit(self, code: int | None) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    def signal(self, kill: bool) -> None:
        """The child's process group (it leads one: what the action started goes too), or
        the child alone if it has not made its group yet."""
        pid = self.process.pid if self.process is not None else None
        if pid is None or self.exited.done():
            return
        sig = signal.SIGKILL if kill else signal.SIGTERM
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        except PermissionError:  # a group of zombies, on some systems
            pass

    def sweep(self) -> None:
        """SIGKILL what is left of the child's process group once the child is gone (its id
        cannot name another group while any process of this one lives)."""
        if self.process is not None and self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def stop(self, grace: float) -> None:
        """SIGTERM, ``grace`` seconds, then SIGKILL (in ``finally``: a second cancellation
        during the grace cannot leave it running)."""
        if self.exited.done():
            return
        self.signal(kill=False)
        try:
            await asyncio.wait({self.exited}, timeout=grace)
        finally:
            if not self.exited.done():
                self.signal(kill=True)
                await asyncio.wait({self.exited}, timeout=_AFTER_KILL)


async def _supervise(proc: _Child, timeout: float, kill_grace: float) -> bool:  # noqa: ASYNC109
    """Wait for the child's result or end; False when it timed out (and was stopped)."""
    try:
        either: set[asyncio.Future[Any]] = {proc.outcome, proc.exited}
        done, _ = await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            await proc.stop(kill_grace)
            return False
        if not proc.outcome.done():
            # Exited first: a result sent just before may still be in the pipe (or the thread
            # reading it); the pipe's end says all was read (bounded: a process the action
            # forked may hold it open).
            pending: set[asyncio.Future[Any]] = {proc.outcome, proc.drained}
            await asyncio.wait(pending, timeout=_AFTER_KILL, return_when=asyncio.FIRST_COMPLETED)
            return True
        # It returned and is exiting: a moment to do so, then nothing of it may stay behind.
        await asyncio.wait({proc.exited}, timeout=_AFTER_KILL)
        await proc.stop(0)
        return True
    except asyncio.CancelledError:
        await proc.stop(kill_grace)
        raise


def _exit_error(code: int | None) -> str:
    if code == child.LEASE_EXPIRED:
        return "the action's process stopped itself: the worker's lease expired (it lost its standing)"
    if code is not None and code < 0:
        return f"the action's process was killed by signal {-code}"
    return f"the action's process exited with code {code} before returning"


async def run_isolated(
    definition: ActionDefinition,
    parameters: dict[str, Any],
    *,
    timeout: float,  # noqa: ASYNC109 - a timed-out run is a result, not an exception
    kill_grace: float,
    lease: Lease,
    output_limit: int = OUTPUT_LIMIT,
) -> ActionResult:
    """Like runners.python.run_python, in a child process; the execution context (and its
    ``ctx.log()`` destination) is the caller's ``current()``. Never raises except
    ``asyncio.CancelledError``, after the child is stopped."""
    started = time.monotonic()

    def failed(error: str, stderr: str = "", exit_code: int | None = None) -> ActionResult:
        text, cut = capped_text(stderr, output_limit)
        return ActionResult(
            succeeded=False,
            exit_code=exit_code,
            duration=time.monotonic() - started,
            stderr=text,
            stderr_truncated=cut,
            error=clean_text(error, ERROR_LIMIT),
        )

    name = entry_point(definition)
    if name is None:
        return failed(f"action {definition.ref} cannot run in a process: its function is not importable by name")
    ctx = current()
    proc = _Child(ctx.output)
    args = (name, parameters, (ctx.execution_id, ctx.attempt, ctx.worker), lease.deadline)
    starting = asyncio.ensure_future(asyncio.to_thread(proc.start, args))
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        # Cancelled while the thread starts it: the child may be up all the same.
        with contextlib.suppress(Exception):
            await starting
        if proc.process is not None:
            await proc.stop(kill_grace)
            proc.sweep()
        raise
    except Exception as e:  # e.g. parameters that cannot be pickled, no fork server
        return failed(f"cannot start the action's process: {type(e).__name__}: {e}")
    try:
        finished = await _supervise(proc, timeout, kill_grace)
    finally:
        proc.sweep()  # whatever the action started and left behind in its group
    if not finished:
        return ActionResult(
            succeeded=False,
            exit_code=None,
            duration=time.monotonic() - started,
            error=f"timed out after {timeout:g}s",
            timed_out=True,
        )
    if not proc.outcome.done():
        code = proc.exited.result()
        if code == child.LEASE_EXPIRED:
            # Not the action failing: the worker is losing its standing (its watchdog fences at
            # the same deadline, checked less often) and is about to stop this run, which is then
            # released to recovery. A "failed" result must not race that and land first.
            await asyncio.sleep(max(_AFTER_KILL, lease.span))
        return failed(_exit_error(code))
    message = proc.outcome.result()
    if message[0] == "error":
        return failed(message[1], message[2], exit_code=1)
    try:
        data, truncated = stored_value(message[1], output_limit)
    except Unstorable as e:
        return failed(f"the returned value cannot be stored: {e}", exit_code=1)
    return ActionResult(
        succeeded=True, exit_code=0, duration=time.monotonic() - started, data=data, data_truncated=truncated
    )
