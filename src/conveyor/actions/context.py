"""The execution an action runs for, as the action itself sees it.

Inside a Python action (sync or async), ``current()`` names the execution, the attempt
(the fencing token with the execution id) and the worker running it::

    from conveyor.actions.context import current

    @action("shop.charge")
    def charge(order_id: int) -> None:
        ctx = current()
        payments.charge(order_id, idempotency_key=f"{ctx.execution_id}")

The worker sets it around each run (a context variable: each run's task has its own,
and the Python runner copies it into the thread of a sync action).

``ctx.log("...")`` adds a line to the execution's live output (stream ``log``), which
``conveyor executions tail``, the API's output stream and the dashboard show while it runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ExecutionContext:
    execution_id: int
    attempt: int
    worker: str  # the worker's name
    # Where ctx.log() lines go: the worker's live output for this run (safe from any thread).
    output: Callable[[str, bytes], None] | None = field(default=None, repr=False, compare=False)

    def log(self, message: str) -> None:
        """A line in the execution's live output, in order with the others. Characters
        UTF-8 cannot carry are written as backslash escapes; the stream is capped at
        ``worker.output_limit`` bytes like stdout and stderr."""
        if self.output is not None:
            text = message if message.endswith("\n") else message + "\n"
            self.output("log", text.encode("utf-8", "backslashreplace"))


_CURRENT: ContextVar[ExecutionContext | None] = ContextVar("conveyor_execution_context", default=None)


def current() -> ExecutionContext:
    """The execution being run; LookupError outside a run."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise LookupError("not inside a Conveyor action run: no current execution")
    return ctx


@contextlib.contextmanager
def running(ctx: ExecutionContext) -> Iterator[ExecutionContext]:
    """Make ``ctx`` the current execution for the block (the worker, around a run)."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
