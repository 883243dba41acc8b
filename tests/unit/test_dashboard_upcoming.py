"""The next fire times the schedules page shows (``automation.upcoming``, pure) are the
engine's: the same instants as ``conveyor schedules get`` / REST
(verbs.schedules.next_fire_times over conveyor.domain.schedules), including a slot in a
spring-forward gap, which a second croniter reading once showed an hour late; none past
``ends``, and none for a row the engine could not read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from conveyor.api.dashboard.automation import upcoming
from conveyor.domain import schedules as sch

NOW = datetime(2026, 3, 28, 12, 0, 30, tzinfo=UTC)
CREATED = datetime(2026, 3, 1, tzinfo=UTC)


def row(kind: str = "cron", **fields: Any) -> dict[str, Any]:
    """A schedule row as dash_schedules reads it."""
    base = {"kind": kind, "cron": None, "timezone": "UTC", "every": None, "at": None, "starts": None, "ends": None,
            "catchup": "latest", "catchup_window": timedelta(hours=1), "overlap": "allow", "created": CREATED,
            "updated": CREATED, "last_slot": None, "next_fire": None}  # fmt: skip
    return {**base, **fields}


def cron(expr: str, tz: str = "UTC", **rest: Any) -> dict[str, Any]:
    return row(cron=expr, timezone=tz, **rest)


def test_a_slot_in_the_spring_forward_gap_is_the_instant_the_engine_fires() -> None:
    # Paris skips 02:00-03:00 on 2026-03-29: "30 2 * * *" fires when the gap ends, 03:00
    # CEST = 01:00 UTC (croniter's wall time read with fold=0 said 01:30 UTC).
    times = upcoming(cron("30 2 * * *", "Europe/Paris"), NOW)
    assert times[0] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    spec = sch.Spec("cron", cron="30 2 * * *", timezone="Europe/Paris")
    assert times == sch.upcoming(spec, NOW, 3)


def test_cron_in_its_time_zone_across_a_dst_change() -> None:
    # Paris moves to summer time on 2026-03-29: 03:00 local is 02:00 UTC, then 01:00 UTC.
    times = upcoming(cron("0 3 * * *", "Europe/Paris"), NOW)
    assert times == [datetime(2026, 3, d, 1, 0, tzinfo=UTC) for d in (29, 30, 31)]
    assert upcoming(cron("0 3 * * *"), NOW)[0] == datetime(2026, 3, 29, 3, 0, tzinfo=UTC)


def test_after_the_last_slot_decided_and_the_last_change() -> None:
    # Slots up to 12:05 decided: the page starts at 12:10, as the engine will.
    decided = datetime(2026, 3, 28, 12, 5, tzinfo=UTC)
    times = upcoming(cron("*/5 * * * *", last_slot=decided), NOW)
    assert times == [decided + timedelta(minutes=m) for m in (5, 10, 15)]


def test_interval_steps_from_its_anchor() -> None:
    every = timedelta(minutes=7)
    anchor = datetime(2026, 3, 28, 11, 0, tzinfo=UTC)
    times = upcoming(row("interval", every=every, starts=anchor), NOW)
    assert times == [anchor + k * every for k in (9, 10, 11)]  # 12:03 is the first after 11:59:50


def test_nothing_past_the_end_or_for_what_cannot_be_read() -> None:
    ends = datetime(2026, 3, 28, 12, 12, tzinfo=UTC)
    assert len(upcoming(cron("*/5 * * * *", ends=ends), NOW)) == 2  # 12:05, 12:10
    assert upcoming(cron("not a cron"), NOW) == []
    assert upcoming(cron("* * * * *", "Mars/Olympus"), NOW) == []
    assert upcoming(cron("0 0 30 2 *"), NOW) == []  # 30 February: never
    soon = NOW + timedelta(hours=1)
    assert upcoming(row("date", at=soon), NOW) == [soon]
    assert upcoming(row("date", at=soon, last_slot=soon), NOW) == []  # fired


def test_six_fields_put_seconds_first() -> None:
    # 12:00:30 is NOW: within the engine's ON_TIME window it is still the next to fire.
    times = upcoming(cron("30 */5 * * * *"), NOW)
    assert times == [datetime(2026, 3, 28, 12, m, 30, tzinfo=UTC) for m in (0, 5, 10)]


def test_a_repeated_wall_time_is_shown_once() -> None:
    # Paris falls back on 2026-10-25: 02:30 happens twice; the slot is its first occurrence.
    before = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)
    times = upcoming(cron("30 2 * * *", "Europe/Paris"), before)
    assert times[:2] == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]


@given(st.text(max_size=40), st.text(max_size=40))
def test_any_expression_or_zone_answers_a_list(expr: str, tz: str) -> None:
    times = upcoming(cron(expr, tz), NOW)
    assert len(times) <= 3
    assert times == sorted(times)
