"""The child side of an isolated Python action (``isolation="process"``, runners/isolated.py).

Runs in a process forked from the worker's fork server: it imports the action by its entry
point, calls it with the parameters, and sends over its pipe, in order, the ``ctx.log()``
lines and then the result (the value, or the error with its traceback text).

It must never act beside the re-run of its execution elsewhere, even when the worker cannot
tell it to stop (the host was frozen, the worker hung or was killed). So it holds a *lease*:
a monotonic deadline in shared memory that the worker moves forward after each successful
heartbeat (last heartbeat + ``self_fence_after``, the moment the worker itself would stop
its work). A watchdog thread checks it every few milliseconds, and a SIGCONT handler checks
it the moment a frozen host is thawed; past it, the process ends with ``os._exit`` at once.
The clock is CLOCK_MONOTONIC, one clock for every process of the host, and it keeps running
while a process is stopped.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import inspect
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from conveyor.actions.context import ExecutionContext, running

LEASE_EXPIRED = 75  # the exit code of a child that stopped itself: its lease ran out
WATCH_EVERY = 0.002  # seconds between two looks at the lease
_PR_SET_PDEATHSIG = 1


class _Lease:
    def __init__(self, deadline: Any) -> None:
        self._deadline = deadline  # a shared double (multiprocessing RawValue)

    def check(self, *_: object) -> None:
        if time.monotonic() >= self._deadline.value:
            os._exit(LEASE_EXPIRED)  # no cleanup, no flush: nothing more of this run may happen

    def watch(self) -> None:
        while True:
            self.check()
            time.sleep(WATCH_EVERY)


def resolve(entry_point: str) -> Any:
    """The callable named ``module:qualname``."""
    module_name, _, qualname = entry_point.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def main(
    conn: Connection, entry_point: str, parameters: dict[str, Any], context: tuple[int, int, str], deadline: Any
) -> None:
    """The child's target (on the fork server's side of ``multiprocessing``)."""
    lease = _Lease(deadline)
    lease.check()
    # The worker shuts down gracefully on SIGINT; a terminal's ^C reaches its whole process
    # group, and must not kill the actions it is letting finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Its own process group, so that the worker's kill reaches what the action starts too.
    os.setpgid(0, 0)
    signal.signal(signal.SIGCONT, lease.check)  # thawed: runs before this thread's next bytecode
    # Its parent is the fork server, which exits when the worker does: then this goes too.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=lease.watch, name="conveyor-lease", daemon=True).start()
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:  # ctx.log() from any of the action's threads
            conn.send(message)

    def log(stream: str, data: bytes) -> None:
        send(("log", stream, data))

    try:
        func = resolve(entry_point)
        with running(ExecutionContext(*context, output=log)):
            value = func(**parameters)
            if inspect.iscoroutine(value):
                value = asyncio.run(value)
    except (Exception, SystemExit) as e:
        send(("error", _describe(e), _traceback(e)))
        return
    try:
        send(("ok", value))
    except Exception as e:  # not picklable: it could not have been stored either
        send(("error", f"the returned value cannot be sent to the worker: {_describe(e)}", ""))


def _describe(e: BaseException) -> str:
    from conveyor.domain.storable import describe

    return describe(e)


def _traceback(e: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(e))
    except Exception:
        return _describe(e) + "\n"
