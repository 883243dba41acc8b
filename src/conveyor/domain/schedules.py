"""Schedules (issue #13): slot arithmetic and the firing decision, pure.

A schedule's slots are instants (UTC):

- ``cron``: a cron expression read in an IANA time zone. Five fields (minute hour
  day-of-month month day-of-week), or six with **seconds first** (second minute hour
  day-of-month month day-of-week: the Quartz/Spring/robfig convention; croniter's own
  default puts seconds last, so we pass ``second_at_beginning``). ``@hourly``,
  ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly`` are accepted. The expression is
  matched against *wall-clock* times (naive local datetimes), then each match becomes an
  instant:

  * a wall time that does not exist (the spring-forward gap: 02:30 in Europe/Paris on the
    last Sunday of March) fires at the instant the clocks jump (03:00 CEST), once -- as
    Vixie cron runs jobs of the skipped hour right after the change;
  * a wall time that happens twice (the fall-back overlap: 02:30 on the last Sunday of
    October) fires at its first occurrence (CEST, ``fold=0``) only: the repeated hour
    does not repeat its slots.

  So a daily 02:30 job fires once on each of those days, and slots stay strictly
  increasing.
- ``interval``: ``anchor + k * every`` (k >= 0), anchored at ``starts`` (else the
  schedule's creation); plain elapsed time, no time zone involved.
- ``date``: one slot, ``at``.

``starts`` (inclusive) and ``ends`` (inclusive) bound every kind. The database clock
decides: every function takes ``now`` (the database's ``now()``) rather than reading a
clock.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadDateError, CroniterError, croniter  # type: ignore[import-untyped]

from conveyor.domain.delays import DelayError, parse_duration
from conveyor.domain.errors import ConveyorError

KINDS = ("cron", "interval", "date")
CATCHUP = ("skip", "latest", "all")
OVERLAP = ("allow", "skip", "buffer_one", "cancel_previous")
ORIGINS = ("scheduled", "catchup", "manual", "backfill")
OUTCOMES = ("requested", "emitted", "skipped", "missed", "buffered", "request_error")

# A slot fired at most this late is on time (origin 'scheduled', whatever the catch-up
# policy): an executor's restart or a slow transaction is not an outage. Later than this
# the catch-up policy decides.
ON_TIME = timedelta(seconds=10)
# Slots decided per schedule per pass: an outage of a year on a 1-second schedule is
# worked through in passes of this many rows (the schedule stays due until caught up).
MAX_SLOTS_PER_PASS = 1000
# Backfill: at most this many slots per call.
MAX_BACKFILL = 10_000
MIN_EVERY = timedelta(seconds=1)
_MICRO = timedelta(microseconds=1)
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD = re.compile(r"^[0-9A-Za-z*/,?#L-]+$")


class InvalidScheduleError(ConveyorError):
    """A schedule that cannot be used: said in one line (HTTP 422)."""


# -- parsing --------------------------------------------------------------------------


def parse_cron(expr: str) -> str:
    """The expression as stored (aliases expanded); 5 or 6 fields (seconds first)."""
    text = " ".join(str(expr).split())
    text = _ALIASES.get(text.lower(), text)
    fields = text.split(" ")
    if len(fields) not in (5, 6) or not all(_FIELD.match(f) for f in fields):
        raise InvalidScheduleError(
            f"invalid cron expression {expr!r}: give 5 fields (minute hour day month weekday) or 6 with seconds first"
        )
    try:
        croniter(text, datetime(2000, 1, 1), second_at_beginning=len(fields) == 6).get_next(datetime)
    except (CroniterError, ValueError, KeyError, TypeError) as exc:
        raise InvalidScheduleError(f"invalid cron expression {expr!r}: {exc}") from None
    return text


# In the tz database's listing but not a place: 'localtime' is a copy of the host's own
# zone (replicas on hosts set differently would disagree on every slot), 'Factory' is
# the "no zone set" placeholder.
_NOT_PLACES = frozenset({"localtime", "Factory", "posixrules"})


@functools.lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones()) - _NOT_PLACES


def parse_timezone(name: str) -> ZoneInfo:
    """An IANA zone by its listed name: never a path (``../etc``), a host-dependent file
    (``localtime``) or the leap-second ``right/`` variants, which ZoneInfo would open."""
    try:
        if name not in _zone_names():
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidScheduleError(
            f"unknown time zone {name!r}: give an IANA name such as Europe/Paris or UTC"
        ) from None


def parse_every(text: str) -> timedelta:
    """``30s``, ``5m``, ``1h30m``, ``2d``: at least one second."""
    try:
        every = parse_duration(text)
    except DelayError as exc:
        raise InvalidScheduleError(str(exc).replace("--in", "--interval")) from None
    return check_every(every)


def check_every(every: timedelta) -> timedelta:
    if every < MIN_EVERY:
        raise InvalidScheduleError(f"interval {every.total_seconds():g}s: at least 1 second")
    return every


def _aware(when: datetime | None, what: str) -> datetime | None:
    if when is not None and (when.tzinfo is None or when.utcoffset() is None):
        raise InvalidScheduleError(f"{what}: {when.isoformat()} has no UTC offset")
    return when


# -- the spec -------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What decides a schedule's slots and how they fire (the schedule row's columns)."""

    kind: str
    cron: str | None = None
    timezone: str = "UTC"
    every: timedelta | None = None
    at: datetime | None = None
    starts: datetime | None = None
    ends: datetime | None = None
    catchup: str = "latest"
    catchup_window: timedelta = timedelta(hours=1)
    overlap: str = "allow"
    # Interval slots are anchored here: starts, else the schedule's creation.
    created: datetime | None = None
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidScheduleError(f"unknown schedule kind {self.kind!r}: cron, interval or date")
        if (self.kind == "cron") != (self.cron is not None):
            raise InvalidScheduleError("a cron schedule needs a cron expression (and only it has one)")
        if (self.kind == "interval") != (self.every is not None):
            raise InvalidScheduleError("an interval schedule needs an interval (and only it has one)")
        if (self.kind == "date") != (self.at is not None):
            raise InvalidScheduleError("a date schedule needs a time (and only it has one)")
        if self.cron is not None:
            object.__setattr__(self, "cron", parse_cron(self.cron))
        if self.every is not None:
            check_every(self.every)
        object.__setattr__(self, "_zone", parse_timezone(self.timezone))
        for what in ("at", "starts", "ends", "created"):
            _aware(getattr(self, what), what)
        if self.catchup not in CATCHUP:
            raise InvalidScheduleError(f"unknown catch-up policy {self.catchup!r}: skip, latest or all")
        if self.overlap not in OVERLAP:
            raise InvalidScheduleError(
                f"unknown overlap policy {self.overlap!r}: allow, skip, buffer_one or cancel_previous"
            )
        if self.catchup_window < timedelta(0):
            raise InvalidScheduleError("the catch-up window cannot be negative")
        if self.starts is not None and self.ends is not None and self.ends < self.starts:
            raise InvalidScheduleError("ends is before starts")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Spec:
        return cls(
            kind=row["kind"],
            cron=row["cron"],
            timezone=row["timezone"],
            every=row["every"],
            at=row["at"],
            starts=row["starts"],
            ends=row["ends"],
            catchup=row["catchup"],
            catchup_window=row["catchup_window"],
            overlap=row["overlap"],
            created=row.get("created"),
        )

    @property
    def zone(self) -> ZoneInfo:
        return self._zone

    @property
    def anchor(self) -> datetime:
        anchor = self.starts or self.created
        if anchor is None:
            raise InvalidScheduleError("an interval schedule needs starts or its creation time")
        return anchor


# -- slot arithmetic ------------------------------------------------------------------


def slots_after(spec: Spec, after: datetime) -> Iterator[datetime]:
    """Every slot strictly after ``after``, in order (bounded by starts and ends)."""
    if spec.starts is not None and after < spec.starts:
        after = spec.starts - _MICRO
    if spec.kind == "date":
        inner: Iterator[datetime] = iter([spec.at] if spec.at is not None and spec.at > after else [])
    elif spec.kind == "interval":
        inner = _interval_after(spec, after)
    else:
        inner = _cron_after(spec, after)
    for slot in inner:
        if spec.ends is not None and slot > spec.ends:
            return
        yield slot


def _interval_after(spec: Spec, after: datetime) -> Iterator[datetime]:
    assert spec.every is not None
    anchor, step = spec.anchor, spec.every // _MICRO
    k = 0 if after < anchor else (after - anchor) // _MICRO // step + 1
    while True:
        yield anchor + timedelta(microseconds=k * step)
        k += 1


def _cron_after(spec: Spec, after: datetime) -> Iterator[datetime]:
    assert spec.cron is not None
    zone = spec.zone
    local = after.astimezone(zone).replace(tzinfo=None)
    six = len(spec.cron.split(" ")) == 6
    it = croniter(spec.cron, local, second_at_beginning=six)
    last = after
    while True:
        try:
            wall = it.get_next(datetime)
        except CroniterBadDateError:  # e.g. 30 February: no more matches
            return
        slot = wall_to_instant(wall, zone)
        if slot <= last:  # the repeated hour's second pass, or two wall times in one gap
            continue
        last = slot
        yield slot


def wall_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """A naive wall-clock time in ``zone`` as an instant (UTC): ambiguous times at their
    first occurrence; nonexistent ones (a DST gap) at the instant the gap ends."""
    first = wall.replace(tzinfo=zone, fold=0)
    utc = first.astimezone(UTC)
    if utc.astimezone(zone).replace(tzinfo=None) == wall:
        return utc
    # In a gap: fold=1 reads it with the offset after the change (an instant before the
    # jump), fold=0 with the one before (an instant after it). The jump is between.
    lo, hi = wall.replace(tzinfo=zone, fold=1).astimezone(UTC), utc
    if lo > hi:
        lo, hi = hi, lo
    while hi - lo > _MICRO:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).replace(tzinfo=None) >= wall:
            hi = mid
        else:
            lo = mid
    # Transitions fall on whole seconds: round up the microsecond the search stops on.
    return hi.replace(microsecond=0) + (timedelta(seconds=1) if hi.microsecond else timedelta(0))


def upcoming(spec: Spec, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` slots after ``after`` (the next fire times shown)."""
    out: list[datetime] = []
    for slot in slots_after(spec, after):
        if len(out) >= count:
            break
        out.append(slot)
    return out


def slots_between(spec: Spec, since: datetime, until: datetime, limit: int = MAX_BACKFILL) -> list[datetime]:
    """Slots in [since, until): a backfill. More than ``limit``: refused."""
    _aware(since, "since")
    _aware(until, "until")
    if until <= since:
        raise InvalidScheduleError("backfill: until must be after since")
    out: list[datetime] = []
    for slot in slots_after(spec, since - _MICRO):
        if slot >= until:
            break
        if len(out) >= limit:
            raise InvalidScheduleError(f"backfill: more than {limit} slots in that range; give a shorter one")
        out.append(slot)
    return out


def first_after(spec: Spec, last_slot: datetime | None, changed: datetime) -> datetime:
    """The exclusive lower bound of the slots still to decide: after the last slot
    decided, and after the schedule's last change (a new or changed schedule starts
    afresh; slots while it was paused are not fired -- backfill them). A date schedule
    fires its one slot unless decided already, whenever it was created."""
    if spec.kind == "date":
        assert spec.at is not None
        return last_slot if last_slot is not None else spec.at - _MICRO
    return changed if last_slot is None else max(last_slot, changed)


# -- the firing decision --------------------------------------------------------------

FIRE, SKIP, MISS, BUFFER = "fire", "skip", "miss", "buffer"


@dataclass(frozen=True)
class Decision:
    slot: datetime
    origin: str  # scheduled | catchup
    action: str  # fire | skip (overlap) | miss (catch-up) | buffer (buffer_one)


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    cancel: int | None  # the previous run to cancel (cancel_previous)
    next_fire: datetime | None  # None: no slot left
    last_slot: datetime | None


def plan(
    spec: Spec,
    after: datetime,
    now: datetime,
    *,
    running: int | None = None,
    buffered: bool = False,
    emits: bool = False,
    limit: int = MAX_SLOTS_PER_PASS,
    last_slot: datetime | None = None,
) -> Plan:
    """Which slots in (``after``, ``now``] to record, how, and the next fire time.

    ``running``: the execution of an earlier slot still going (overlap applies to it);
    ``buffered``: a slot already waits for it (buffer_one); ``emits``: the schedule emits
    events (no execution: overlap does not apply). On-time slots (at most ON_TIME late)
    fire; later ones follow the catch-up policy: ``skip`` fires none, ``latest`` the
    newest one within catchup_window, ``all`` every one within it; the others are
    missed. Then overlap, on the slots that fire, in order: ``skip`` fires one only if
    nothing runs; ``buffer_one`` buffers one more (and fires none while one waits);
    ``cancel_previous`` fires only the last
    (cancelling ``running``); ``allow`` fires all. At most ``limit`` slots: the next fire
    time is then already due, and the next pass goes on."""
    due: list[datetime] = []
    following: datetime | None = None
    for slot in slots_after(spec, after):
        if slot > now or len(due) >= limit:
            following = slot
            break
        due.append(slot)
    late_bound = now - ON_TIME
    decisions: list[Decision] = []
    for i, slot in enumerate(due):
        nxt = due[i + 1] if i + 1 < len(due) else following
        if slot >= late_bound:
            decisions.append(Decision(slot, "scheduled", FIRE))
        elif spec.catchup == "skip" or now - slot > spec.catchup_window:
            decisions.append(Decision(slot, "catchup", MISS))
        elif spec.catchup == "all" or nxt is None or nxt > now or nxt >= late_bound:
            decisions.append(Decision(slot, "catchup", FIRE))
        else:  # latest, and a later slot is late too
            decisions.append(Decision(slot, "catchup", MISS))
    cancel = None
    if not emits:
        decisions, cancel = _overlap(spec.overlap, decisions, running, buffered)
    return Plan(tuple(decisions), cancel, following, due[-1] if due else last_slot)


def _overlap(
    policy: str, decisions: list[Decision], running: int | None, buffered: bool
) -> tuple[list[Decision], int | None]:
    firing = [i for i, d in enumerate(decisions) if d.action == FIRE]
    if policy == "allow" or not firing:
        return decisions, None
    out = list(decisions)
    if policy == "cancel_previous":
        for i in firing[:-1]:
            out[i] = Decision(out[i].slot, out[i].origin, SKIP)
        return out, running
    # A waiting slot (buffer_one) is next in line even once its run has ended: it is
    # released after this pass, so a new slot must not fire ahead of it.
    busy, waiting = running is not None or (policy == "buffer_one" and buffered), buffered
    for i in firing:
        if not busy:
            busy = True  # fires; what follows in this pass overlaps it
        elif policy == "buffer_one" and not waiting:
            out[i] = Decision(out[i].slot, out[i].origin, BUFFER)
            waiting = True
        else:
            out[i] = Decision(out[i].slot, out[i].origin, SKIP)
    return out, None
