"""The workflow definition verbs (verbs/workflows.py) run by both drivers: the sync one
(SDK, CLI) and the async one (API) give the same answers and the same refusals, and a
refused registration stores nothing. Registration's checks run as work the async driver
hands a thread; their refusal reaches the caller as the sync driver's does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from conveyor.domain.errors import ConflictError, ConveyorError, InvalidWorkflowError, NotFoundError
from conveyor.store.db import AsyncConn, connect
from conveyor.verbs import workflows
from conveyor.verbs.drive import Verb, run, run_async
from conveyor.workflows.registration import Definition
from integration.builders import Conn

SOURCE = "ref: {ref}\ntasks:\n  hi:\n    action: core.echo message=hi\n"


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[AsyncConn]:
    async with await connect(db_url, "conveyor", autocommit=True) as c:
        yield c


async def refusals(conn: Conn, aconn: AsyncConn, verb: Callable[[], Verb[Any]]) -> tuple[BaseException, BaseException]:
    """The same verb's refusal by each driver."""
    with pytest.raises((ConveyorError, psycopg.Error)) as sync:
        run(conn, verb())
    with pytest.raises((ConveyorError, psycopg.Error)) as asynchronous:
        await run_async(aconn, verb())
    return sync.value, asynchronous.value


def stored(conn: Conn) -> list[tuple[str, int]]:
    rows = conn.execute("SELECT ref, version FROM workflow_definition WHERE deleted IS NULL ORDER BY ref").fetchall()
    return [(r["ref"], r["version"]) for r in rows]


async def test_register_and_delete_by_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    assert run(conn, workflows.register([Definition(text=SOURCE.format(ref="t.a"))])) == [{"ref": "t.a", "version": 1}]
    assert await run_async(aconn, workflows.register([Definition(text=SOURCE.format(ref="t.b"))])) == [
        {"ref": "t.b", "version": 1}
    ]
    both = [Definition(text=SOURCE.format(ref="t.a")), Definition(text=SOURCE.format(ref="t.b"))]
    registered = await run_async(aconn, workflows.register(both))
    assert registered == [{"ref": "t.a", "version": 2}, {"ref": "t.b", "version": 2}]
    assert stored(conn) == [("t.a", 1), ("t.a", 2), ("t.b", 1), ("t.b", 2)]
    assert (run(conn, workflows.delete("t.a")), await run_async(aconn, workflows.delete("t.b"))) == (2, 2)
    assert stored(conn) == []


async def test_refusals_are_the_same_and_store_nothing(conn: Conn, aconn: AsyncConn) -> None:
    # Every problem of every definition, from the checks run as the driver's work.
    bad = [Definition(text=SOURCE.format(ref="t.ok")), Definition(text="ref: t.bad\ntasks: {x: {action: no.such}}")]
    sync, asynchronous = await refusals(conn, aconn, lambda: workflows.register(bad))
    assert isinstance(sync, InvalidWorkflowError)
    assert isinstance(asynchronous, InvalidWorkflowError)
    assert sync.problems == asynchronous.problems
    assert sync.problems
    # The database's refusal (CVC03): the ref is another runner type's action.
    sync, asynchronous = await refusals(
        conn, aconn, lambda: workflows.register([Definition(text=SOURCE.format(ref="core.echo"))])
    )
    assert isinstance(sync, ConflictError)
    assert (type(asynchronous), str(asynchronous)) == (ConflictError, str(sync))
    sync, asynchronous = await refusals(conn, aconn, lambda: workflows.delete("t.never"))
    assert isinstance(sync, NotFoundError)
    assert (type(asynchronous), str(asynchronous)) == (NotFoundError, str(sync))
    assert str(sync) == "no workflow 't.never' (see `conveyor workflows list`)"
    assert stored(conn) == []
