"""The next fire times the schedules page shows (``automation.upcoming``, pure): the
stored next_fire first, then croniter's slots in the schedule's time zone or steps of
``every``; from the database clock when next_fire is unset; none past ``ends``, for an
unreadable cron or time zone, or for a date already past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from conveyor.api.dashboard.automation import upcoming

NOW = datetime(2026, 3, 28, 12, 0, 30, tzinfo=UTC)


def cron(expr: str, tz: str = "UTC", **rest: Any) -> dict[str, Any]:
    return {"kind": "cron", "cron": expr, "timezone": tz, "next_fire": None, "ends": None, **rest}


def test_cron_from_the_stored_next_fire() -> None:
    stored = datetime(2026, 3, 28, 12, 5, tzinfo=UTC)
    times = upcoming(cron("*/5 * * * *", next_fire=stored), NOW)
    assert times == [stored, stored + timedelta(minutes=5), stored + timedelta(minutes=10)]


def test_cron_in_its_time_zone_across_a_dst_change() -> None:
    # Paris moves to summer time on 2026-03-29: 03:00 local is 02:00 UTC, then 01:00 UTC.
    times = upcoming(cron("0 3 * * *", "Europe/Paris"), NOW)
    assert [t.astimezone(UTC) for t in times] == [
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 30, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 31, 1, 0, tzinfo=UTC),
    ]
    assert next(t.astimezone(UTC) for t in upcoming(cron("0 3 * * *", "UTC"), NOW)) == datetime(
        2026, 3, 29, 3, 0, tzinfo=UTC
    )


def test_interval_from_its_anchor_or_next_fire() -> None:
    every = timedelta(minutes=7)
    anchor = datetime(2026, 3, 28, 11, 0, tzinfo=UTC)
    times = upcoming({"kind": "interval", "every": every, "starts": anchor, "next_fire": None, "ends": None}, NOW)
    assert times[0] == anchor + 9 * every  # 12:03, the first slot at or after 12:00:30
    assert times[1:] == [times[0] + every, times[0] + 2 * every]
    stored = datetime(2026, 3, 28, 12, 1, tzinfo=UTC)
    assert upcoming({"kind": "interval", "every": every, "next_fire": stored, "ends": None}, NOW)[1] == stored + every


def test_nothing_past_the_end_or_for_what_cannot_be_read() -> None:
    ends = datetime(2026, 3, 28, 12, 12, tzinfo=UTC)
    assert len(upcoming(cron("*/5 * * * *", ends=ends), NOW)) == 2  # 12:05, 12:10
    assert upcoming(cron("not a cron"), NOW) == []
    assert upcoming(cron("* * * * *", "Mars/Olympus"), NOW) == []
    past = NOW - timedelta(days=1)
    assert upcoming({"kind": "date", "at": past, "next_fire": None, "ends": None}, NOW) == []
    soon = NOW + timedelta(hours=1)
    assert upcoming({"kind": "date", "at": soon, "next_fire": soon, "ends": None}, NOW) == [soon]


def test_six_fields_put_seconds_first() -> None:
    # "30 */5 * * * *": second 30 of every fifth minute (seconds first, as the engine reads it).
    times = upcoming(cron("30 */5 * * * *"), NOW)
    assert times == [datetime(2026, 3, 28, 12, m, 30, tzinfo=UTC) for m in (5, 10, 15)]


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
