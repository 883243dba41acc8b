"""The schedule verbs (conveyor.verbs.schedules) run by both drivers against the real
database: the sync one (the SDK's, and so the CLI's) and the async one (the API's) give
the same answer and the same refusal for the same verb."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from conveyor.domain.errors import ConflictError, ConveyorError, NotFoundError, UnknownActionError
from conveyor.domain.schedules import InvalidScheduleError
from conveyor.store.db import AsyncConn, Conn, connect
from conveyor.verbs import schedules as sv
from conveyor.verbs.drive import Verb, run, run_async

NIGHTLY = {"cron": "30 2 * * *", "timezone": "Europe/Paris", "action": "core.noop", "description": "nightly"}
# What differs between two schedules made the same way, one by each driver.
OWN = {"id", "name", "created", "updated", "trigger", "next_fire"}


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[AsyncConn]:
    async with await connect(db_url, "conveyor", autocommit=True) as c:
        yield c


def same(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The two answers without what is each schedule's own; they must be equal."""
    mine = {k: v for k, v in a.items() if k not in OWN}
    assert mine == {k: v for k, v in b.items() if k not in OWN}
    return mine


def pick(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: row[k] for k in keys}


async def refused(conn: Conn, aconn: AsyncConn, verb: Callable[[], Verb[Any]], kind: type[Exception]) -> str:
    """The same refusal from both drivers (type and message); the message."""
    with pytest.raises(kind) as by_sync:
        run(conn, verb())
    with pytest.raises(kind) as by_async:
        await run_async(aconn, verb())
    assert type(by_sync.value) is type(by_async.value)
    assert str(by_sync.value) == str(by_async.value)
    return str(by_sync.value)


async def test_create_and_read(conn: Conn, aconn: AsyncConn) -> None:
    made = same(run(conn, sv.create("s1", NIGHTLY)), await run_async(aconn, sv.create("a1", NIGHTLY)))
    assert pick(made, "kind", "paused", "slots") == {"kind": "cron", "paused": False, "slots": []}
    assert len(made["next_fire_times"]) == 5
    assert run(conn, sv.read("a1", 2, 0))["next_fire_times"] == made["next_fire_times"][:2]
    assert (await run_async(aconn, sv.read("s1", 1, 0)))["next_fire_times"] == made["next_fire_times"][:1]


async def test_create_refusals(conn: Conn, aconn: AsyncConn) -> None:
    run(conn, sv.create("taken", NIGHTLY))
    assert "taken" in await refused(conn, aconn, lambda: sv.create("taken", NIGHTLY), ConflictError)
    assert "no.such" in await refused(
        conn, aconn, lambda: sv.create("x", {**NIGHTLY, "action": "no.such"}), UnknownActionError
    )
    bad = {**NIGHTLY, "cron": "61 * * * *"}
    assert "invalid cron expression" in await refused(conn, aconn, lambda: sv.create("x", bad), InvalidScheduleError)
    # Nothing was written by a refusal, and the connections are usable.
    assert run(conn, sv.read("taken"))["description"] == "nightly"
    await refused(conn, aconn, lambda: sv.read("x"), NotFoundError)


async def test_create_with_replace(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, sv.create(name, NIGHTLY))
    once = {"at": "2030-01-01T12:00:00+00:00", "action": "core.noop"}
    replaced = same(
        run(conn, sv.create("s", once, replace=True)), await run_async(aconn, sv.create("a", once, replace=True))
    )
    assert pick(replaced, "kind", "cron", "next_fire_times") == {
        "kind": "date",
        "cron": None,
        "next_fire_times": [datetime(2030, 1, 1, 12, tzinfo=UTC)],
    }


async def test_patch(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, sv.create(name, NIGHTLY))
    patched = same(
        run(conn, sv.patch("s", {"overlap": "skip"})), await run_async(aconn, sv.patch("a", {"overlap": "skip"}))
    )
    assert pick(patched, "overlap", "cron", "description") == {
        "overlap": "skip",
        "cron": "30 2 * * *",
        "description": "nightly",
    }
    assert "no schedule 'nope'" in await refused(
        conn, aconn, lambda: sv.patch("nope", {"overlap": "skip"}), NotFoundError
    )
    await refused(conn, aconn, lambda: sv.patch("s", {"timezone": "Mars/Olympus"}), InvalidScheduleError)
    await refused(conn, aconn, lambda: sv.patch("s", {"action": "no.such"}), UnknownActionError)
    assert run(conn, sv.read("s"))["timezone"] == "Europe/Paris"


async def test_pause_and_resume(conn: Conn, aconn: AsyncConn) -> None:
    ids = {name: run(conn, sv.create(name, NIGHTLY))["id"] for name in ("s", "a")}
    assert run(conn, sv.pause("s")) == {"name": "s", "id": ids["s"], "was_paused": False}
    assert await run_async(aconn, sv.pause("a")) == {"name": "a", "id": ids["a"], "was_paused": False}
    assert run(conn, sv.pause("s"))["was_paused"] is (await run_async(aconn, sv.pause("a")))["was_paused"] is True
    assert [run(conn, sv.read(name))["paused"] for name in ("s", "a")] == [True, True]
    assert run(conn, sv.resume("s"))["was_paused"] is (await run_async(aconn, sv.resume("a")))["was_paused"] is True
    assert not run(conn, sv.read("s"))["paused"]
    await refused(conn, aconn, lambda: sv.pause("nope"), NotFoundError)
    await refused(conn, aconn, lambda: sv.resume("nope"), NotFoundError)


async def test_fire(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, sv.create(name, NIGHTLY))
    by_sync, by_async = run(conn, sv.fire("s")), await run_async(aconn, sv.fire("a"))
    assert len(by_sync) == len(by_async) == 1
    for slot in (by_sync[0], by_async[0]):
        assert pick(slot, "origin", "outcome") == {"origin": "manual", "outcome": "requested"}
        assert slot["execution"] is not None
    assert [s["origin"] for s in run(conn, sv.read("a"))["slots"]] == ["manual"]
    assert "nope" in await refused(conn, aconn, lambda: sv.fire("nope"), NotFoundError)


async def test_backfill(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, sv.create(name, {**NIGHTLY, "timezone": "UTC"}))
    since, until = "2026-01-01T00:00:00", datetime(2026, 1, 4, tzinfo=UTC)
    by_sync = run(conn, sv.backfill("s", since, until))
    by_async = await run_async(aconn, sv.backfill("a", since, until))
    assert (
        [r["slot"] for r in by_sync]
        == [r["slot"] for r in by_async]
        == [datetime(2026, 1, d, 2, 30, tzinfo=UTC) for d in (1, 2, 3)]
    )
    assert {r["origin"] for r in by_sync + by_async} == {"backfill"}
    # Each slot once: a second backfill of the same window fires nothing.
    assert run(conn, sv.backfill("a", since, until)) == await run_async(aconn, sv.backfill("s", since, until)) == []
    await refused(conn, aconn, lambda: sv.backfill("nope", since, until), NotFoundError)
    await refused(conn, aconn, lambda: sv.backfill("s", "yesterday", until), InvalidScheduleError)


async def test_delete(conn: Conn, aconn: AsyncConn) -> None:
    for name in ("s", "a"):
        run(conn, sv.create(name, NIGHTLY))
    assert run(conn, sv.delete("s")) is None
    assert await run_async(aconn, sv.delete("a")) is None
    message = await refused(conn, aconn, lambda: sv.delete("s"), NotFoundError)
    assert message == str(sv.not_found("s"))
    assert isinstance(sv.not_found("s"), ConveyorError)
