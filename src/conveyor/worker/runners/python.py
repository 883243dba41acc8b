"""Run a Python action: async callables on the worker's loop, sync ones in a thread pool."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import time
import traceback
from typing import Any

from conveyor.actions.registry import ActionDefinition
from conveyor.domain.models import ActionResult
from conveyor.domain.storable import (
    ERROR_LIMIT,
    OUTPUT_LIMIT,
    Unstorable,
    capped_text,
    clean_text,
    describe,
    stored_value,
)


class _TimedOut(Exception):
    pass


async def _call_async(func: Any, parameters: dict[str, Any], seconds: float) -> Any:
    try:
        async with asyncio.timeout(seconds) as scope:
            return await func(**parameters)
    except TimeoutError:
        if scope.expired():
            raise _TimedOut from None
        raise  # the action's own TimeoutError: an ordinary failure


async def _call_sync(
    func: Any, parameters: dict[str, Any], seconds: float, executor: concurrent.futures.Executor | None
) -> Any:
    loop = asyncio.get_running_loop()
    # Like asyncio.to_thread: the action sees the caller's context variables (e.g. log context).
    call = functools.partial(contextvars.copy_context().run, functools.partial(func, **parameters))
    future = loop.run_in_executor(executor, call)
    try:
        done, _ = await asyncio.wait({future}, timeout=seconds)
    finally:
        if not future.done():
            # A thread cannot be killed: an overrunning (or abandoned) sync action keeps running
            # in the background and occupies its pool thread until it returns. Cancelling the
            # asyncio wrapper only makes its eventual result (or exception) be dropped silently.
            future.cancel()
        elif not future.cancelled():
            # Finished as this wait was cancelled (a user's cancel, the worker losing its
            # standing): its exception, abandoned, would be logged at collection as "Future
            # exception was never retrieved" with the action's traceback (found by the chaos
            # suite). Retrieving it marks it seen; result() below still raises it when wanted.
            future.exception()
    if not done:
        raise _TimedOut
    return future.result()


def _traceback(e: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(e))
    except Exception:  # e.g. a chain of causes too deep to format: the summary will do
        return describe(e) + "\n"


async def run_python(
    definition: ActionDefinition,
    parameters: dict[str, Any],
    *,
    timeout: float,  # noqa: ASYNC109 - a timed-out run is a result, not an exception
    executor: concurrent.futures.ThreadPoolExecutor | None = None,
    output_limit: int = OUTPUT_LIMIT,
) -> ActionResult:
    """Call the action's function with the parameters as keyword arguments. Never raises
    except ``asyncio.CancelledError``; ``executor=None`` means the loop's default pool.

    The returned value is stored as JSON, cut to ``output_limit`` bytes (``data_truncated``);
    one PostgreSQL cannot store (not JSON, NaN, a NUL or an unpaired surrogate in a string)
    fails the run with the reason. A traceback is cut to ``output_limit`` bytes like output."""
    started = time.monotonic()
    func = definition.func
    if func is None:
        return ActionResult(
            succeeded=False, exit_code=None, duration=0.0, error="action has no Python code on this worker"
        )
    is_async = inspect.iscoroutinefunction(func) or bool(definition.metadata.get("async"))
    try:
        if is_async:
            value = await _call_async(func, parameters, timeout)
        else:
            value = await _call_sync(func, parameters, timeout, executor)
    except _TimedOut:
        return ActionResult(
            succeeded=False,
            exit_code=None,
            duration=time.monotonic() - started,
            error=f"timed out after {timeout:g}s",
            timed_out=True,
        )
    except (Exception, SystemExit) as e:  # SystemExit: an action calling sys.exit() must not stop the worker
        stderr, cut = capped_text(_traceback(e), output_limit)
        return ActionResult(
            succeeded=False,
            exit_code=1,
            duration=time.monotonic() - started,
            stderr=stderr,
            stderr_truncated=cut,
            error=describe(e),
        )
    try:
        data, truncated = stored_value(value, output_limit)
    except Unstorable as e:
        error = clean_text(f"the returned value cannot be stored: {e}", ERROR_LIMIT)
        return ActionResult(succeeded=False, exit_code=1, duration=time.monotonic() - started, error=error)
    return ActionResult(
        succeeded=True, exit_code=0, duration=time.monotonic() - started, data=data, data_truncated=truncated
    )
