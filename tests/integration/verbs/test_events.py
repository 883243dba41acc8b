"""The trigger and event verbs (verbs/events.py) run by both drivers: the sync one (SDK,
CLI) and the async one (API) give the same answers and the same refusals; and through
the SDK functions that take the caller's own connection (no search_path, tuple rows),
whose search_path and row factory are left as they were."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from conveyor.domain.delays import DelayError
from conveyor.domain.errors import ConflictError, ConveyorError, InvalidPayloadError, InvalidTriggerError, NotFoundError
from conveyor.sdk.events import emit_event_once, replay_events
from conveyor.store.db import AsyncConn, connect
from conveyor.verbs import events
from conveyor.verbs.drive import Verb, run, run_async
from integration.builders import Conn

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[AsyncConn]:
    async with await connect(db_url, "conveyor", autocommit=True) as c:
        yield c


async def same_refusal(conn: Conn, aconn: AsyncConn, verb: Callable[[], Verb[Any]]) -> BaseException:
    """The refusal of the sync driver, checked the same (type and message) by the async one."""
    with pytest.raises((ConveyorError, psycopg.Error)) as sync:
        run(conn, verb())
    with pytest.raises((ConveyorError, psycopg.Error)) as asynchronous:
        await run_async(aconn, verb())
    assert (type(asynchronous.value), str(asynchronous.value)) == (type(sync.value), str(sync.value))
    return sync.value


async def test_triggers_by_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    assert run(conn, events.register_trigger("t.a", SCHEMA, "a")) is True
    assert await run_async(aconn, events.register_trigger("t.b", SCHEMA, "b")) is True
    assert await run_async(aconn, events.register_trigger("t.a", None)) is False
    assert run(conn, events.register_trigger("t.b", None)) is False
    rows = conn.execute("SELECT name, payload_schema FROM trigger WHERE name LIKE 't.%' ORDER BY name").fetchall()
    assert rows == [{"name": "t.a", "payload_schema": None}, {"name": "t.b", "payload_schema": None}]
    refused = await same_refusal(conn, aconn, lambda: events.register_trigger("t.c", {"type": 5}))
    assert isinstance(refused, InvalidTriggerError)
    run(conn, events.delete_trigger("t.a"))
    await run_async(aconn, events.delete_trigger("t.b"))
    refused = await same_refusal(conn, aconn, lambda: events.delete_trigger("t.a"))
    assert isinstance(refused, NotFoundError)
    assert conn.execute("SELECT count(*) AS n FROM trigger WHERE name LIKE 't.%'").fetchone() == {"n": 0}


async def test_emit_and_replay_by_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    run(conn, events.register_trigger("t.a", SCHEMA))
    first = run(conn, events.emit("t.a", {"n": 1}, "sdk", "k"))
    assert await run_async(aconn, events.emit("t.a", {"n": 1}, "api", "k")) == (first[0], True)
    assert first[1] is False
    second, repeated = await run_async(aconn, events.emit("t.a", {"n": 2}, "api"))
    assert (second > first[0], repeated) == (True, False)
    refused = await same_refusal(conn, aconn, lambda: events.emit("t.a", {"n": 0}, "sdk"))
    assert isinstance(refused, InvalidPayloadError)
    assert refused.problems == ["payload.n: 0 is less than the minimum of 1"]
    refused = await same_refusal(conn, aconn, lambda: events.emit("t.a", {"n": 3}, "sdk", "k"))
    assert isinstance(refused, ConflictError)
    refused = await same_refusal(conn, aconn, lambda: events.emit("t.none", {}, "sdk"))
    assert isinstance(refused, NotFoundError)

    again = run(conn, events.replay_event(first[0]))
    more = await run_async(aconn, events.replay_event(first[0]))
    assert first[0] < again < more
    refused = await same_refusal(conn, aconn, lambda: events.replay_event(10**9))
    assert isinstance(refused, NotFoundError)
    since = conn.execute("SELECT now() - interval '1 hour' AS t").fetchone()["t"]  # type: ignore[index]
    pairs = run(conn, events.replay_events("t.a", since))
    assert [original for original, _ in pairs] == [first[0], second]
    assert [original for original, _ in await run_async(aconn, events.replay_events("t.a", since))] == [
        first[0],
        second,
    ]
    refused = await same_refusal(conn, aconn, lambda: events.replay_events("t.a", since, since - timedelta(1)))
    assert isinstance(refused, DelayError)
    refused = await same_refusal(conn, aconn, lambda: events.replay_events("t.none", since))
    assert isinstance(refused, NotFoundError)


def test_on_the_callers_connection_its_settings_are_kept(conn: Conn, db_url: str) -> None:
    run(conn, events.register_trigger("t.a", SCHEMA))
    with psycopg.connect(db_url) as caller:  # tuple rows, no search_path to the schema
        path = caller.execute("SHOW search_path").fetchone()
        eid, repeated = emit_event_once(caller, "t.a", {"n": 1})
        assert caller.execute("SHOW search_path").fetchone() == path
        with pytest.raises(InvalidPayloadError):
            emit_event_once(caller, "t.a", {"n": 0})
        assert caller.execute("SHOW search_path").fetchone() == path
        since = caller.execute("SELECT now() - interval '1 hour'").fetchone()
        assert since is not None
        # (until given: now() is the transaction's start, the event's own received time)
        assert [o for o, _ in replay_events(caller, "t.a", since[0], since[0] + timedelta(hours=2))] == [eid]
        assert caller.execute("SHOW search_path").fetchone() == path
        caller.rollback()
    assert conn.execute("SELECT count(*) AS n FROM event").fetchone() == {"n": 0}
    with psycopg.connect(db_url, autocommit=True) as caller:  # already on the schema: nothing to put back
        caller.execute("SET search_path = conveyor")
        assert emit_event_once(caller, "t.a", {"n": 2})[1] is False
        assert caller.execute("SHOW search_path").fetchone() == ("conveyor",)
    assert repeated is False
    assert conn.execute("SELECT count(*) AS n FROM event").fetchone() == {"n": 1}
