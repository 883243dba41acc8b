"""The schedule domain (issue #13): slot arithmetic (cron with seconds, zones, DST,
intervals, dates) and the firing decision (catch-up, overlap), with properties."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.domain import schedules as sch
from conveyor.domain.schedules import InvalidScheduleError, Spec, plan, upcoming

T0 = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)
PARIS = ZoneInfo("Europe/Paris")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_cron_five_and_six_fields() -> None:
    assert upcoming(Spec("cron", cron="*/15 * * * *"), T0, 3) == [T0 + timedelta(minutes=m) for m in (15, 30, 45)]
    # Six fields: seconds first.
    assert upcoming(Spec("cron", cron="*/20 * * * * *"), T0, 3) == [T0 + timedelta(seconds=s) for s in (20, 40, 60)]
    assert upcoming(Spec("cron", cron="@hourly"), T0, 1) == [T0 + timedelta(hours=1)]


@pytest.mark.parametrize("bad", ["", "* * * *", "61 * * * *", "* * * * * * *", "* * 32 * *", "a b c d e", "*;* * * *"])
def test_bad_cron_refused(bad: str) -> None:
    with pytest.raises(InvalidScheduleError, match="cron"):
        Spec("cron", cron=bad)


def test_bad_zone_and_interval_refused() -> None:
    with pytest.raises(InvalidScheduleError, match="time zone"):
        Spec("cron", cron="* * * * *", timezone="Nowhere/City")
    with pytest.raises(InvalidScheduleError, match="time zone"):
        Spec("cron", cron="* * * * *", timezone="../etc/passwd")
    with pytest.raises(InvalidScheduleError, match="1 second"):
        Spec("interval", every=timedelta(milliseconds=500), created=T0)
    with pytest.raises(InvalidScheduleError, match="interval"):
        sch.parse_every("often")
    assert sch.parse_every("1h30m") == timedelta(minutes=90)


def test_cron_read_in_its_zone() -> None:
    spec = Spec("cron", cron="0 9 * * 1-5", timezone="America/New_York")
    assert [s.isoformat() for s in upcoming(spec, T0, 2)] == ["2026-11-25T14:00:00+00:00", "2026-11-26T14:00:00+00:00"]


def test_dst_spring_forward_fires_once_as_the_clocks_jump() -> None:
    spec = Spec("cron", cron="30 2 * * *", timezone="Europe/Paris")
    got = upcoming(spec, utc("2026-03-27T12:00:00+00:00"), 3)
    # 28 March 02:30 CET; 29 March 02:30 does not exist: 03:00 CEST (01:00Z); 30 March 02:30 CEST.
    assert got == [utc("2026-03-28T02:30:00+01:00"), utc("2026-03-29T03:00:00+02:00"), utc("2026-03-30T02:30:00+02:00")]


def test_dst_fall_back_fires_once_at_the_first_occurrence() -> None:
    spec = Spec("cron", cron="30 2 * * *", timezone="Europe/Paris")
    got = upcoming(spec, utc("2026-10-24T12:00:00+00:00"), 2)
    assert got == [utc("2026-10-25T02:30:00+02:00"), utc("2026-10-26T02:30:00+01:00")]
    # An hourly job does not repeat the repeated hour either (wall-clock slots).
    hourly = upcoming(Spec("cron", cron="30 * * * *", timezone="Europe/Paris"), utc("2026-10-24T23:00:00+00:00"), 4)
    assert [s.astimezone(PARIS).strftime("%H:%M%z") for s in hourly] == ["01:30+0200", "02:30+0200", "03:30+0100",
                                                                          "04:30+0100"]  # fmt: skip


def test_gap_wall_times_collapse_to_one_slot() -> None:
    spec = Spec("cron", cron="0,30 2,3 * * *", timezone="Europe/Paris")
    got = upcoming(spec, utc("2026-03-29T00:00:00+00:00"), 3)
    assert got == [utc("2026-03-29T03:00:00+02:00"), utc("2026-03-29T03:30:00+02:00"), utc("2026-03-30T02:00:00+02:00")]


def test_interval_anchored_at_starts_else_created() -> None:
    spec = Spec("interval", every=timedelta(seconds=10), starts=T0)
    assert upcoming(spec, T0 - timedelta(hours=1), 2) == [T0, T0 + timedelta(seconds=10)]
    assert upcoming(spec, T0 + timedelta(seconds=15), 1) == [T0 + timedelta(seconds=20)]
    created = Spec("interval", every=timedelta(minutes=1), created=T0)
    assert upcoming(created, T0, 1) == [T0 + timedelta(minutes=1)]


def test_date_and_ends() -> None:
    once = Spec("date", at=T0)
    assert upcoming(once, sch.first_after(once, None, T0 + timedelta(days=1)), 5) == [T0]
    assert upcoming(once, T0, 5) == []
    bounded = Spec("interval", every=timedelta(seconds=1), starts=T0, ends=T0 + timedelta(seconds=2))
    assert len(upcoming(bounded, T0 - timedelta(seconds=1), 10)) == 3


def test_backfill_range() -> None:
    spec = Spec("interval", every=timedelta(minutes=1), starts=T0)
    assert len(sch.slots_between(spec, T0, T0 + timedelta(minutes=10))) == 10
    with pytest.raises(InvalidScheduleError, match="until"):
        sch.slots_between(spec, T0, T0)
    with pytest.raises(InvalidScheduleError, match="more than"):
        sch.slots_between(spec, T0, T0 + timedelta(days=30))


def every_second(**kw: object) -> Spec:
    return Spec("interval", every=timedelta(seconds=1), starts=T0, **kw)  # type: ignore[arg-type]


def test_plan_on_time_fires_and_moves_next_fire() -> None:
    p = plan(every_second(), T0 - timedelta(microseconds=1), T0 + timedelta(seconds=2, milliseconds=5))
    assert [(d.action, d.origin) for d in p.decisions] == [("fire", "scheduled")] * 3
    assert p.next_fire == T0 + timedelta(seconds=3)
    assert p.last_slot == T0 + timedelta(seconds=2)


@pytest.mark.parametrize(("policy", "fires"), [("skip", 0), ("latest", 1), ("all", 5)])
def test_plan_catch_up(policy: str, fires: int) -> None:
    spec = Spec("interval", every=timedelta(minutes=1), starts=T0, catchup=policy, catchup_window=timedelta(minutes=5))
    now = T0 + timedelta(minutes=20, seconds=30)  # 21 slots, all late; 5 within the window
    p = plan(spec, T0 - timedelta(microseconds=1), now)
    assert len(p.decisions) == 21
    assert sum(d.action == "fire" for d in p.decisions) == fires
    if policy == "latest":
        assert p.decisions[-1].action == "fire"


def test_plan_overlap() -> None:
    now = T0 + timedelta(seconds=2, milliseconds=1)
    acts = {pol: [d.action for d in plan(every_second(overlap=pol), T0 - timedelta(microseconds=1), now,
                                         running=7).decisions] for pol in sch.OVERLAP}  # fmt: skip
    assert acts == {"allow": ["fire"] * 3, "skip": ["skip"] * 3, "buffer_one": ["buffer", "skip", "skip"],
                    "cancel_previous": ["skip", "skip", "fire"]}  # fmt: skip
    assert plan(every_second(overlap="cancel_previous"), T0, now, running=7).cancel == 7
    assert [d.action for d in plan(every_second(overlap="skip"), T0, now, running=7, emits=True).decisions] == [
        "fire"
    ] * 2


def test_plan_buffered_slot_goes_first() -> None:
    # buffer_one: the run a slot waited for has ended (nothing running) but the waiting slot
    # is not released yet (released after the pass). The next due slot must not fire ahead
    # of it -- it would leave the waiting slot buffered for good (found by the chaos suite).
    now = T0 + timedelta(milliseconds=1)
    p = plan(every_second(overlap="buffer_one"), T0 - timedelta(microseconds=1), now, running=None, buffered=True)
    assert [d.action for d in p.decisions] == ["skip"]


def test_plan_limited_pass_stays_due() -> None:
    p = plan(every_second(catchup="all"), T0 - timedelta(microseconds=1), T0 + timedelta(seconds=9), limit=4)
    assert len(p.decisions) == 4
    assert p.next_fire == T0 + timedelta(seconds=4)


CRONS = st.sampled_from(["* * * * *", "*/7 * * * *", "30 2 * * *", "0 */3 * * 1-5", "*/13 * * * * *", "15 1,2,3 * * *"])
ZONES = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])
INSTANTS = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC))


@settings(max_examples=150, deadline=None)
@given(cron=CRONS, zone=ZONES, after=INSTANTS)
def test_cron_slots_strictly_increase(cron: str, zone: str, after: datetime) -> None:
    got = upcoming(Spec("cron", cron=cron, timezone=zone), after, 30)
    assert got
    assert got[0] > after
    assert all(a < b for a, b in itertools.pairwise(got))


@settings(max_examples=150, deadline=None)
@given(
    cron=CRONS, zone=ZONES, start=INSTANTS, outage=st.integers(0, 3 * 86400), policy=st.sampled_from(sch.CATCHUP),
    window=st.integers(0, 7200), overlap=st.sampled_from(sch.OVERLAP), running=st.sampled_from([None, 5]),
)  # fmt: skip
def test_plan_properties(cron: str, zone: str, start: datetime, outage: int, policy: str, window: int,
                         overlap: str, running: int | None) -> None:  # fmt: skip
    spec = Spec("cron", cron=cron, timezone=zone, catchup=policy, catchup_window=timedelta(seconds=window),
                overlap=overlap)  # fmt: skip
    now = start + timedelta(seconds=outage)
    p = plan(spec, start, now, running=running)
    seen = [d.slot for d in p.decisions]
    assert all(a < b for a, b in itertools.pairwise(seen))
    assert len(set(seen)) == len(seen)
    assert all(start < s <= now for s in seen)
    for d in p.decisions:
        if d.origin == "catchup" and d.action != "miss":
            assert now - d.slot <= spec.catchup_window  # catch-up window respected
        if d.origin == "scheduled":
            assert now - d.slot <= sch.ON_TIME
    if len(p.decisions) < sch.MAX_SLOTS_PER_PASS:
        assert p.next_fire is not None
        assert p.next_fire > now
    # Decided again from where it stopped: nothing decided twice.
    again = plan(spec, p.last_slot or start, now, running=running)
    assert not {d.slot for d in again.decisions} & set(seen) or len(p.decisions) == sch.MAX_SLOTS_PER_PASS


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory", "right/UTC", "posix/Europe/Paris", "UTC+5"])
def test_host_dependent_or_odd_zones_are_refused(zone: str) -> None:
    # 'localtime' is whatever the host's /etc/localtime is: replicas on hosts in different
    # zones would compute different slots for one schedule. right/* count leap seconds.
    with pytest.raises(InvalidScheduleError, match="time zone"):
        Spec("cron", cron="* * * * *", timezone=zone)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/Argentina/Buenos_Aires", "Etc/GMT+5", "EST5EDT"])
def test_iana_zones_are_accepted(zone: str) -> None:
    assert Spec("cron", cron="* * * * *", timezone=zone).zone.key == zone
