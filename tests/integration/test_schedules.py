"""Schedules (issue #13) against a real PostgreSQL: each slot once, catch-up after an
outage with each policy, each overlap policy, pause/resume/fire/backfill, a cron in a
zone across DST, two firers at once. The firing is driven with the database clock:
schedules are moved into the past (created/updated/starts) rather than waited for."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.domain.errors import ConflictError, NotFoundError, UnknownActionError
from conveyor.domain.schedules import InvalidScheduleError
from conveyor.executor.schedules import Firer
from conveyor.sdk import Client
from integration.builders import Conn, client_of

Pool = AsyncConnectionPool[Any]


@pytest.fixture
def client(conn: Conn) -> Iterator[Client]:
    with client_of(conn) as c:
        yield c


def backdate(conn: Conn, name: str, seconds: float, *, starts: float | None = None) -> None:
    """As if the schedule had been created ``seconds`` ago (and started ``starts`` ago)."""
    conn.execute(
        "UPDATE schedule SET created = now() - make_interval(secs => %(s)s), updated = now() - make_interval(secs => "
        "%(s)s), starts = CASE WHEN %(st)s::float8 IS NULL THEN starts ELSE now() - make_interval(secs => %(st)s) "
        "END, next_fire = now() - make_interval(secs => %(s)s) WHERE name = %(n)s",
        {"s": seconds, "st": starts, "n": name},
    )


def slots(conn: Conn, name: str) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT ss.* FROM schedule_slot ss JOIN schedule s ON s.id = ss.schedule WHERE s.name = %s ORDER BY ss.slot",
        (name,),
    ).fetchall()


def outcomes(conn: Conn, name: str) -> list[str]:
    return [r["outcome"] for r in slots(conn, name)]


async def fire(pool: Pool) -> int:
    return (await Firer(pool, batch_size=100).run_pass()).slots


async def test_each_slot_fires_once_and_next_fire_moves_on(conn: Conn, pool: Pool, client: Client) -> None:
    client.create_schedule("tick", every=1, action="core.noop")
    backdate(conn, "tick", 5.5)
    assert await fire(pool) == 5
    assert await fire(pool) == 0  # nothing due any more: no slot twice
    rows = slots(conn, "tick")
    assert [r["outcome"] for r in rows] == ["requested"] * 5
    assert all(r["origin"] == "scheduled" for r in rows)
    assert len({r["slot"] for r in rows}) == 5
    assert len({r["execution"] for r in rows}) == 5
    who = conn.execute("SELECT DISTINCT requested_by FROM execution WHERE id = ANY(%s)",
                       ([r["execution"] for r in rows],)).fetchall()  # fmt: skip
    assert who == [{"requested_by": "schedule:tick"}]
    sched = conn.execute("SELECT next_fire > now() AS later, last_slot FROM schedule WHERE name = 'tick'").fetchone()
    assert sched is not None
    assert sched["later"]
    assert sched["last_slot"] == rows[-1]["slot"]


@pytest.mark.parametrize(("policy", "fired", "missed"), [("skip", 0, 30), ("latest", 1, 29), ("all", 10, 20)])
async def test_outage_catch_up(conn: Conn, pool: Pool, client: Client, policy: str, fired: int, missed: int) -> None:
    # 30 slots a minute apart, the newest 30 s ago: all late; 10 within the 10-minute window.
    client.create_schedule("late", every=60, action="core.noop", catchup=policy, catchup_window="10m")
    backdate(conn, "late", 1900, starts=1770)
    await fire(pool)
    rows = slots(conn, "late")
    assert len(rows) == 30
    assert sum(r["outcome"] == "requested" for r in rows) == fired
    assert sum(r["outcome"] == "missed" for r in rows) == missed
    assert all(r["origin"] == "catchup" for r in rows)
    if policy == "latest":
        assert rows[-1]["outcome"] == "requested"  # the newest one
    assert await fire(pool) == 0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("allow", ["requested"] * 3),
        ("skip", ["requested", "skipped", "skipped"]),
        ("buffer_one", ["requested", "buffered", "skipped"]),
    ],
)
async def test_overlap(conn: Conn, pool: Pool, client: Client, policy: str, expected: list[str]) -> None:
    # No worker: the first run is still going when the next slots come.
    client.create_schedule("busy", every=1, action="core.noop", overlap=policy)
    backdate(conn, "busy", 3.5)
    await fire(pool)
    assert outcomes(conn, "busy") == expected
    if policy == "buffer_one":
        firer = Firer(pool, batch_size=10)
        assert await firer.release_buffered() == 0  # the first run has not ended
        first = slots(conn, "busy")[0]["execution"]
        conn.execute("SELECT cancel_execution(%s, 'test')", (first,))
        assert await firer.release_buffered() == 1
        assert outcomes(conn, "busy") == ["requested", "requested", "skipped"]


async def test_overlap_cancel_previous(conn: Conn, pool: Pool, client: Client) -> None:
    client.create_schedule("latest-only", every=1, action="core.noop", overlap="cancel_previous")
    manual = client.fire_schedule("latest-only")
    assert manual is not None
    assert manual["origin"] == "manual"
    backdate(conn, "latest-only", 2.5)
    conn.execute("UPDATE schedule_slot SET slot = now() - interval '1 hour'")  # the manual one: earlier
    await fire(pool)
    rows = slots(conn, "latest-only")
    assert [r["outcome"] for r in rows] == ["requested", "skipped", "requested"]
    status = conn.execute("SELECT status FROM execution WHERE id = %s", (manual["execution"],)).fetchone()
    assert status == {"status": "cancelled"}


async def test_pause_resume_fire_backfill(conn: Conn, pool: Pool, client: Client) -> None:
    client.create_schedule("ops", every=60, action="core.noop")
    assert client.pause_schedule("ops")["was_paused"] is False
    backdate(conn, "ops", 300)
    assert await fire(pool) == 0  # paused: nothing fires
    assert client.resume_schedule("ops")["was_paused"] is True
    assert await fire(pool) == 0  # resumed from now: the paused slots are not fired
    fired = client.fire_schedule("ops")
    assert fired is not None
    assert fired["outcome"] == "requested"
    assert fired["origin"] == "manual"
    created = client.schedule("ops")["created"]
    since = created.replace(microsecond=0)
    done = client.backfill_schedule("ops", since, since + timedelta(minutes=5))
    assert len(done) == 5
    assert all(r["origin"] == "backfill" for r in done)
    assert client.backfill_schedule("ops", since, since + timedelta(minutes=5)) == []  # fired already
    with pytest.raises(NotFoundError):
        client.fire_schedule("nope")
    with pytest.raises(NotFoundError):
        client.pause_schedule("nope")


async def test_events_when_no_action(conn: Conn, pool: Pool, client: Client) -> None:
    client.create_schedule("beat", every=1)
    backdate(conn, "beat", 2.5)
    await fire(pool)
    rows = slots(conn, "beat")
    assert [r["outcome"] for r in rows] == ["emitted", "emitted"]
    assert all(r["event"] for r in rows)
    event = conn.execute("SELECT trigger, source, payload FROM event WHERE id = %s", (rows[0]["event"],)).fetchone()
    assert event is not None
    assert event["trigger"] == "beat"
    assert event["source"] == "schedule"
    assert event["payload"]["schedule"] == "beat"
    trig = conn.execute("SELECT type FROM trigger WHERE name = 'beat'").fetchone()
    assert trig == {"type": "interval"}


async def test_cron_in_a_zone_across_dst(conn: Conn, pool: Pool, client: Client) -> None:
    # 02:30 in Paris: on the spring-forward day it does not exist (fires as the clocks
    # jump, 03:00 CEST); on the fall-back day it happens twice (fires once, the first).
    for name, starts, ends in (("spring", "2026-03-28T00:00:00+00:00", "2026-03-30T23:00:00+00:00"),
                               ("autumn", "2026-10-24T00:00:00+00:00", "2026-10-26T23:00:00+00:00")):  # fmt: skip
        client.create_schedule(name, cron="30 2 * * *", timezone="Europe/Paris", action="core.noop",
                               catchup="all", catchup_window="3650d", starts=starts, ends=ends)  # fmt: skip
        conn.execute("UPDATE schedule SET updated = '2026-01-01Z', next_fire = now() WHERE name = %s", (name,))
    await fire(pool)
    got = {n: [r["slot"].astimezone(UTC).strftime("%m-%d %H:%M") for r in slots(conn, n)] for n in ("spring", "autumn")}
    assert got["spring"] == ["03-28 01:30", "03-29 01:00", "03-30 00:30"]
    assert got["autumn"] == ["10-24 00:30", "10-25 00:30", "10-26 01:30"]
    left = conn.execute("SELECT count(*) AS n FROM schedule WHERE next_fire IS NOT NULL AND name IN "
                        "('spring', 'autumn')").fetchone()  # fmt: skip
    assert left == {"n": 0}  # past ends: no next fire


async def test_two_firers_at_once_fire_each_slot_once(conn: Conn, db_url: str, pool: Pool, client: Client) -> None:
    for i in range(20):
        client.create_schedule(f"s{i}", every=1, action="core.noop")
    # One statement, one now(): every schedule created 5.5 s ago and ended 0.2 s ago -- five
    # slots each, however long the creations above took on a busy machine.
    conn.execute(
        "UPDATE schedule SET created = now() - interval '5.5 s', updated = now() - interval '5.5 s', "
        "next_fire = now() - interval '5.5 s', ends = now() - interval '0.2 s'"
    )
    async with AsyncConnectionPool(pool.conninfo, kwargs=pool.kwargs, min_size=1, max_size=4, open=False) as other:
        for p in (pool, other):  # both connected before the race, so neither starts late
            async with p.connection() as c:
                await c.execute("SELECT 1")
        # One schedule per pass: twenty passes to share, so both firers take part.
        firers = [Firer(pool, batch_size=1), Firer(other, batch_size=1)]

        async def drain(f: Firer) -> int:
            total = 0
            for _ in range(30):
                total += (await f.run_pass()).slots
            return total

        a, b = await asyncio.gather(*(drain(f) for f in firers))
    assert a > 0
    assert b > 0
    assert a + b == 100
    count = conn.execute("SELECT count(*) AS slots, count(DISTINCT execution) AS execs FROM schedule_slot").fetchone()
    requested = conn.execute("SELECT count(*) AS n FROM execution WHERE requested_by LIKE 'schedule:%'").fetchone()
    assert count == {"slots": 100, "execs": 100}
    assert requested == {"n": 100}


def test_refusals(client: Client) -> None:
    with pytest.raises(InvalidScheduleError, match="cron"):
        client.create_schedule("bad", cron="61 * * * *", action="core.noop")
    with pytest.raises(InvalidScheduleError, match="time zone"):
        client.create_schedule("bad", cron="* * * * *", timezone="Mars/Olympus", action="core.noop")
    with pytest.raises(InvalidScheduleError, match="interval"):
        client.create_schedule("bad", every="soon", action="core.noop")
    with pytest.raises(UnknownActionError):
        client.create_schedule("bad", every=5, action="no.such")
    client.create_schedule("ok", every=5, action="core.noop")
    with pytest.raises(ConflictError):
        client.create_schedule("ok", every=5, action="core.noop")
    assert client.create_schedule("ok", every=7, action="core.noop", replace=True)["every"] == 7
    assert client.update_schedule("ok", cron="*/5 * * * *")["kind"] == "cron"
    client.delete_schedule("ok")
    with pytest.raises(NotFoundError):
        client.delete_schedule("ok")


def test_next_fire_times_shown(client: Client) -> None:
    shown = client.create_schedule("shown", cron="0 12 * * *", timezone="Asia/Tokyo", action="core.noop")
    times: list[datetime] = shown["next_fire_times"]
    assert len(times) == 5
    assert all(t.astimezone(UTC).hour == 3 for t in times)
    assert [b - a for a, b in itertools.pairwise(times)] == [times[1] - times[0]] * 4
