"""A verb run by both of its drivers against the test database: ``drive.run`` on a sync
connection (the SDK's, the CLI's) and ``drive.run_async`` on a pool connection (the
API's), each given a fresh body from ``verb`` (a generator runs once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from conveyor.domain.errors import ConveyorError
from conveyor.store.db import Conn, Pool
from conveyor.verbs.drive import Verb, run, run_async

T = TypeVar("T")


async def both(
    conn: Conn, pool: Pool, verb: Callable[[], Verb[T]], *, before: Callable[[], object] | None = None
) -> tuple[T, T]:
    """(what the sync driver answered, what the async one did), one after the other;
    ``before`` each: what makes the state the verb changes (a verb that deletes)."""
    if before is not None:
        before()
    synchronous = run(conn, verb())
    if before is not None:
        before()
    async with pool.connection() as aconn:
        asynchronous = await run_async(aconn, verb())
    return synchronous, asynchronous


async def both_refuse(conn: Conn, pool: Pool, verb: Callable[[], Verb[Any]], error: type[ConveyorError]) -> str:
    """The refusal both drivers raise (the same ``error``, the same words): its message."""
    with pytest.raises(error) as synchronous:
        run(conn, verb())
    async with pool.connection() as aconn:
        with pytest.raises(error) as asynchronous:
            await run_async(aconn, verb())
    assert type(synchronous.value) is type(asynchronous.value)
    assert str(synchronous.value) == str(asynchronous.value)
    return str(synchronous.value)


def checked_first(verb: Verb[Any], error: type[ConveyorError]) -> str:
    """A refusal the verb makes before its first statement (a pure check): no driver, no
    connection needed."""
    with pytest.raises(error) as refused:
        next(verb)
    return str(refused.value)
