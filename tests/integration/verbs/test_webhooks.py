"""The webhook verbs (conveyor.verbs.webhooks) run by both drivers against the real
database: the sync one (the SDK's, and so the CLI's) and the async one (the API's and its
door's) give the same answer and the same refusal for the same verb."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from conveyor.domain.errors import ConflictError, NotFoundError
from conveyor.domain.webhooks import InvalidWebhookError
from conveyor.store.db import AsyncConn, Conn, connect
from conveyor.verbs import schedules as sv
from conveyor.verbs import webhooks as hooks
from conveyor.verbs.drive import Verb, run, run_async

SCHEMA = {"type": "object", "required": ["body"]}
# What differs between two webhooks made the same way, one by each driver.
OWN = {"name", "trigger", "created", "updated"}


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[AsyncConn]:
    async with await connect(db_url, "conveyor", autocommit=True) as c:
        yield c


def register(name: str, **fields: Any) -> Verb[dict[str, Any]]:
    return hooks.register(name, **{"auth": "hmac", "secret": "s3cret", "payload_schema": SCHEMA, **fields})


async def refused(conn: Conn, aconn: AsyncConn, verb: Callable[[], Verb[Any]], kind: type[Exception]) -> str:
    """The same refusal from both drivers (type and message); the message."""
    with pytest.raises(kind) as by_sync:
        run(conn, verb())
    with pytest.raises(kind) as by_async:
        await run_async(aconn, verb())
    assert type(by_sync.value) is type(by_async.value)
    assert str(by_sync.value) == str(by_async.value)
    return str(by_sync.value)


async def test_register_and_read(conn: Conn, aconn: AsyncConn) -> None:
    by_sync, by_async = run(conn, register("s")), await run_async(aconn, register("a"))
    assert {k: v for k, v in by_sync.items() if k not in OWN} == {k: v for k, v in by_async.items() if k not in OWN}
    assert (by_sync["trigger"], by_async["trigger"]) == ("s", "a")
    assert by_sync["created_now"] is True
    assert by_sync["secret_set"] is True
    assert "secret" not in by_sync
    assert by_sync["payload_schema"] == SCHEMA
    # Again: an update, the secret kept.
    again = await run_async(aconn, hooks.register("s", auth="hmac", description="updated"))
    assert again["created_now"] is run(conn, hooks.register("a", auth="hmac", description="updated"))["created_now"]
    assert again["created_now"] is False
    assert again["secret_set"] is True
    assert again["description"] == "updated"
    assert run(conn, hooks.read("a"))["description"] == (await run_async(aconn, hooks.read("s")))["description"]


async def test_register_refusals(conn: Conn, aconn: AsyncConn) -> None:
    # Checked before the database: an impossible name, a schema that is no JSON Schema.
    assert "invalid webhook name" in await refused(conn, aconn, lambda: register("a b"), InvalidWebhookError)
    await refused(conn, aconn, lambda: register("x", payload_schema={"type": 7}), InvalidWebhookError)
    # The database's own refusals: CVW01, and CVC05 (the trigger exists with another type).
    message = await refused(
        conn, aconn, lambda: hooks.register("x", auth="none", max_body_bytes=0), InvalidWebhookError
    )
    assert "max_body_bytes 0 out of range" in message
    trigger = run(conn, sv.create("ticks", {"cron": "0 * * * *"}))["trigger"]
    await refused(conn, aconn, lambda: hooks.register("x", auth="none", trigger=trigger), ConflictError)
    await refused(conn, aconn, lambda: hooks.read("x"), NotFoundError)


async def test_enable_and_disable(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, register(name))
    assert run(conn, hooks.set_enabled("s", False)) == {"name": "s", "enabled": False, "was": True}
    assert await run_async(aconn, hooks.set_enabled("a", False)) == {"name": "a", "enabled": False, "was": True}
    assert run(conn, hooks.read("a"))["enabled"] is (await run_async(aconn, hooks.read("s")))["enabled"] is False
    assert (
        run(conn, hooks.set_enabled("s", True))["was"] is (await run_async(aconn, hooks.set_enabled("a", True)))["was"]
    )
    assert "'nope'" in await refused(conn, aconn, lambda: hooks.set_enabled("nope", True), NotFoundError)
    assert "'a b'" in await refused(conn, aconn, lambda: hooks.set_enabled("a b", True), NotFoundError)


async def test_emit(conn: Conn, aconn: AsyncConn) -> None:
    run(conn, register("s"))
    payload = {"body": {"ref": "main"}, "headers": {}}
    first = run(conn, hooks.emit("s", payload, "k1"))
    assert first["repeated"] is False
    # A repeat with the same key and body answers the first event, by either driver.
    assert await run_async(aconn, hooks.emit("s", payload, "k1")) == {**first, "repeated": True}
    assert run(conn, hooks.emit("s", payload, "k1")) == {**first, "repeated": True}
    other = await run_async(aconn, hooks.emit("s", payload, None))
    assert other["event_id"] != first["event_id"]
    changed = {"body": {"ref": "dev"}, "headers": {}}
    await refused(conn, aconn, lambda: hooks.emit("s", changed, "k1"), ConflictError)
    await refused(conn, aconn, lambda: hooks.emit("gone", payload, None), NotFoundError)


async def test_delete(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, register(name))
    assert run(conn, hooks.delete("s")) is None
    assert await run_async(aconn, hooks.delete("a")) is None
    assert await refused(conn, aconn, lambda: hooks.delete("s"), NotFoundError) == str(hooks.not_found("s"))
    await refused(conn, aconn, lambda: hooks.delete("a b"), NotFoundError)
