"""Delayed executions: parsing --in durations and --at times, and the aware-time check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from conveyor.domain.delays import DelayError, check_aware, parse_at, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2d", timedelta(days=2)),
        ("1.5s", timedelta(seconds=1.5)),
        ("250ms", timedelta(milliseconds=250)),
        ("1m30s500ms", timedelta(seconds=90.5)),
        (" 10S ", timedelta(seconds=10)),
        ("0s", timedelta(0)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not a duration"),
        ("30", "not a duration"),
        ("s", "not a duration"),
        ("-5s", "not a duration"),
        ("5 m", "not a duration"),
        ("1x", "not a duration"),
        ("5m5m", "each unit once"),
        ("30s1h", "largest first"),
        ("4000d", "at most 3650 days"),
    ],
)
def test_bad_durations_are_one_line(text: str, says: str) -> None:
    with pytest.raises(DelayError) as info:
        parse_duration(text)
    assert says in str(info.value)
    assert "\n" not in str(info.value)
    assert repr(text) in str(info.value)


def test_at_needs_iso_8601_with_an_offset() -> None:
    assert parse_at("2026-11-25T12:00:05+00:00") == datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC)
    assert parse_at("2026-11-25T12:00:05Z") == datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC)
    plus2 = parse_at("2026-11-25T14:00:05+02:00")
    assert plus2 == datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC)
    assert plus2.utcoffset() == timedelta(hours=2)
    with pytest.raises(DelayError, match="has no UTC offset"):
        parse_at("2026-11-25T12:00:05")
    for bad in ("tomorrow", "12:00", "2026-13-01T00:00:00Z", ""):
        with pytest.raises(DelayError, match="not an ISO 8601 time"):
            parse_at(bad)


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(DelayError, match="no UTC offset"):
        check_aware(datetime(2026, 1, 1))
    aware = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5)))
    assert check_aware(aware) is aware


HUGE = ["99999999999d", "9" * 400 + "d", "99999999999999999999999s", "3651d"]


@pytest.mark.parametrize("text", HUGE)
def test_every_duration_parser_refuses_a_huge_duration_in_one_line(text: str) -> None:
    """Each door's parser (run --in, --interval, --catchup-window, events --since, purge and
    dead-letter ages, retention settings) says so instead of an OverflowError (issue #25)."""
    from conveyor.domain.retention import parse_age, retention_seconds
    from conveyor.domain.schedules import InvalidScheduleError, parse_every
    from conveyor.verbs.schedules import duration

    parsers = [
        (parse_duration, DelayError),
        (parse_every, InvalidScheduleError),
        (lambda t: duration(t, "catchup_window"), InvalidScheduleError),
        (lambda t: duration(t, "interval"), InvalidScheduleError),
        (parse_age, DelayError),
        (retention_seconds, ValueError),
    ]
    for parse, error in parsers:
        with pytest.raises(error) as info:
            parse(text)
        assert "at most 3650 days" in str(info.value), (parse, str(info.value))
        assert "\n" not in str(info.value)
