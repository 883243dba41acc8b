"""The one way tests wait: poll with a deadline (never sleep-and-hope).

``eventually`` and ``stays`` for synchronous code (a test thread, real processes);
``until`` inside an event loop, for sync or async predicates. Importable from every
test folder as ``support.polling`` (tests/ is on sys.path: the folders are namespace
packages, and the chaos suite adds tests/ itself)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class GiveUp(AssertionError):
    """Raised by a polled function to fail at once (e.g. the process it waits on exited)
    instead of being polled again until the deadline."""


def eventually(
    fn: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, message: str | Callable[[], str] = ""
) -> T:
    """Call ``fn`` until it returns something truthy and return that; after ``timeout``
    seconds raise AssertionError with the last value (or the last exception ``fn`` raised)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except GiveUp:
            raise
        except Exception as exc:  # keep polling; reported if it never succeeds
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            detail = message() if callable(message) else message
            raise AssertionError(
                f"not true after {timeout:g}s; last value: {last!r}" + (f"\n{detail}" if detail else "")
            )
        time.sleep(interval)


def stays(fn: Callable[[], bool], duration: float, interval: float = 0.1, message: str = "") -> None:
    """Assert ``fn`` is true on every check during ``duration`` seconds (a negative
    assertion: nothing may happen for a while)."""
    deadline = time.monotonic() + duration
    while True:
        assert fn(), message or "condition stopped holding"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


async def until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "", interval: float = 0.02) -> Any:  # noqa: ASYNC109
    """Await ``predicate`` (sync or async) until it returns something truthy and return
    that; after ``timeout`` seconds raise AssertionError naming ``what``. Exceptions of
    the predicate are not retried: they fail the test at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"not true after {timeout:g}s: {what or predicate}")
        await asyncio.sleep(interval)
