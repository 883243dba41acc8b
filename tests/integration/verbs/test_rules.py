"""The rule verbs (verbs/rules.py) run by both drivers: the sync one (SDK, CLI) and the
async one (API) give the same answers and the same refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from conveyor.domain.errors import ConveyorError, NotFoundError
from conveyor.rules import parse
from conveyor.rules.spec import RuleSpec
from conveyor.store.db import AsyncConn, connect
from conveyor.verbs import rules
from conveyor.verbs.drive import run, run_async
from integration.builders import Conn


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[AsyncConn]:
    async with await connect(db_url, "conveyor", autocommit=True) as c:
        yield c


def spec(ref: str, **more: Any) -> RuleSpec:
    return parse.parse({"ref": ref, "trigger": "t.push", "action": {"ref": "core.echo", "parameters": {}}, **more})


def enabled(conn: Conn) -> dict[str, bool]:
    return {r["ref"]: r["enabled"] for r in conn.execute("SELECT ref, enabled FROM rule ORDER BY ref").fetchall()}


async def test_register_enable_and_delete_by_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    conn.execute("SELECT register_trigger('t.push', 'custom')")
    (a,) = run(conn, rules.register([spec("t.a")]))
    (b,) = await run_async(aconn, rules.register([spec("t.b")]))
    assert (a["ref"], a["created"], b["ref"], b["created"]) == ("t.a", True, "t.b", True)
    again = await run_async(aconn, rules.register([spec("t.a", enabled=False), spec("t.b")]))
    assert [(r["ref"], r["id"], r["created"]) for r in again] == [("t.a", a["id"], False), ("t.b", b["id"], False)]
    assert enabled(conn) == {"t.a": False, "t.b": True}
    # set_enabled answers whether it was enabled before.
    assert (run(conn, rules.set_enabled("t.a", True)), await run_async(aconn, rules.set_enabled("t.b", True))) == (
        False,
        True,
    )
    assert (run(conn, rules.set_enabled("t.a", False)), await run_async(aconn, rules.set_enabled("t.b", False))) == (
        True,
        True,
    )
    assert enabled(conn) == {"t.a": False, "t.b": False}
    run(conn, rules.delete("t.a"))
    await run_async(aconn, rules.delete("t.b"))
    assert enabled(conn) == {}


@pytest.mark.parametrize("verb", ["delete", "enable"])
async def test_refusals_are_the_same(conn: Conn, aconn: AsyncConn, verb: str) -> None:
    def make() -> Any:
        return rules.delete("t.never") if verb == "delete" else rules.set_enabled("t.never", True)

    with pytest.raises(NotFoundError) as sync:
        run(conn, make())
    with pytest.raises(NotFoundError) as asynchronous:
        await run_async(aconn, make())
    assert str(sync.value) == str(asynchronous.value) == "no rule 't.never'"


async def test_a_rule_on_an_unknown_trigger_is_refused_alike_and_all_or_none(conn: Conn, aconn: AsyncConn) -> None:
    conn.execute("SELECT register_trigger('t.push', 'custom')")
    batch = [spec("t.a"), spec("t.b", trigger="t.none")]
    with pytest.raises((ConveyorError, psycopg.Error)) as sync:
        run(conn, rules.register(batch))
    with pytest.raises((ConveyorError, psycopg.Error)) as asynchronous:
        await run_async(aconn, rules.register(batch))
    assert (type(sync.value), str(sync.value)) == (type(asynchronous.value), str(asynchronous.value))
    assert enabled(conn) == {}
