"""Schedule verbs (issue #13): one body each, run by ``drive.run`` (SDK, CLI through the
SDK) and ``drive.run_async`` (API). Each change is one SQL function (``create_schedule``,
``patch_schedule``, ``pause_schedule``, ``resume_schedule``, ``delete_schedule``,
``fire_schedule``, ``backfill_schedule``); what is here is the checks made before it (the
cron expression, the time zone, the durations, with the domain's rules), what its answer
means, and the views of a schedule (its next fire times, computed from the database's now)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain import schedules as sch
from conveyor.domain.errors import NotFoundError
from conveyor.domain.schedules import InvalidScheduleError
from conveyor.domain.storable import unstorable as unstorable_lines
from conveyor.store.db import Row
from conveyor.verbs.common import refusals
from conveyor.verbs.drive import Verb, sql

_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?")
SPEC_FIELDS = (
    "cron",
    "every",
    "at",
    "timezone",
    "starts",
    "ends",
    "action",
    "parameters",
    "catchup",
    "catchup_window",
    "overlap",
    "description",
)
MAX_NEXT = 100


def not_found(name: str) -> NotFoundError:
    return NotFoundError(f"no schedule {name!r} (see `conveyor schedules list`)")


def duration(value: timedelta | float | int | str, what: str) -> timedelta:
    """A duration as a timedelta: seconds (a number) or text such as 30s, 5m, 1h30m."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise InvalidScheduleError(f"{what}: not a duration")
    if isinstance(value, int | float):
        if not 0 <= value <= 10 * 365 * 86400:
            raise InvalidScheduleError(f"{what}: {value} seconds is out of range")
        return timedelta(seconds=value)
    try:
        return sch.parse_every(value) if what == "interval" else _text_duration(value)
    except InvalidScheduleError as exc:
        raise InvalidScheduleError(str(exc).replace("--interval", what)) from None


def _text_duration(text: str) -> timedelta:
    from conveyor.domain.delays import DelayError, parse_duration

    try:
        return parse_duration(text)
    except DelayError as exc:
        raise InvalidScheduleError(str(exc).replace("--in", "--interval")) from None


def instant(value: datetime | str | None, what: str, zone: str) -> datetime | None:
    """ISO 8601; without a UTC offset it is read in the schedule's time zone."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidScheduleError(f"{what} {value!r}: not an ISO 8601 time, e.g. 2026-11-25T12:00:00") from None
    if value.tzinfo is None:
        value = sch.wall_to_instant(value, sch.parse_timezone(zone))
    return value


def create_params(name: str, fields: Mapping[str, Any], *, replace: bool) -> dict[str, Any]:
    """The checked arguments of ``create_schedule``; InvalidScheduleError (422) says what is wrong."""
    unknown = set(fields) - set(SPEC_FIELDS)
    if unknown:
        raise InvalidScheduleError(f"unknown schedule fields: {', '.join(sorted(unknown))}")
    if not isinstance(name, str) or len(name) > 255 or not _NAME.fullmatch(name):
        raise InvalidScheduleError(f"invalid schedule name {name!r}: letters, digits, _ and -, optionally pack.name")
    unstorable = list(unstorable_lines(dict(fields), ""))  # a NUL in a description or a parameter
    if unstorable:
        raise InvalidScheduleError(f"schedule {name}: " + "; ".join(unstorable))
    given = [k for k in ("cron", "every", "at") if fields.get(k) is not None]
    if len(given) != 1:
        raise InvalidScheduleError("give exactly one of cron, interval (every) or at")
    zone = fields.get("timezone") or "UTC"
    sch.parse_timezone(zone)
    every = duration(fields["every"], "interval") if fields.get("every") is not None else None
    window = duration(fields.get("catchup_window", timedelta(hours=1)), "catchup_window")
    parameters = fields.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidScheduleError("parameters must be an object")
    action = fields.get("action")
    if action is not None and (not isinstance(action, str) or not action):
        raise InvalidScheduleError("action must be an action ref")
    spec = sch.Spec(
        kind={"cron": "cron", "every": "interval", "at": "date"}[given[0]],
        cron=fields.get("cron"),
        timezone=zone,
        every=every,
        at=instant(fields.get("at"), "at", zone),
        starts=instant(fields.get("starts"), "starts", zone),
        ends=instant(fields.get("ends"), "ends", zone),
        catchup=fields.get("catchup") or "latest",
        catchup_window=window,
        overlap=fields.get("overlap") or "allow",
    )
    return {
        "name": name,
        "kind": spec.kind,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "every": spec.every,
        "at": spec.at,
        "starts": spec.starts,
        "ends": spec.ends,
        "action_ref": action,
        "parameters": Jsonb(parameters),
        "catchup": spec.catchup,
        "catchup_window": spec.catchup_window,
        "overlap": spec.overlap,
        "description": fields.get("description"),
        "replace": replace,
    }


def fields_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored schedule as the fields create_params takes (PATCH merges into these)."""
    return {
        "cron": row["cron"],
        "every": row["every"],
        "at": row["at"],
        "timezone": row["timezone"],
        "starts": row["starts"],
        "ends": row["ends"],
        "action": row["action_ref"],
        "parameters": row["parameters"],
        "catchup": row["catchup"],
        "catchup_window": row["catchup_window"],
        "overlap": row["overlap"],
        "description": row["description"],
    }


def patched(row: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """PATCH: the stored fields with these changes; giving one of cron/every/at replaces the others."""
    fields = fields_of(row)
    if any(changes.get(k) is not None for k in ("cron", "every", "at")):
        fields.update(cron=None, every=None, at=None)
    fields.update(changes)
    return fields


# A PATCH's fields as patch_schedule's columns: the timing (cron, every, at and the kind
# they make) is one, so naming any of them replaces the four.
_COLUMNS = {
    "cron": ("kind", "cron", "every", "at"),
    "every": ("kind", "cron", "every", "at"),
    "at": ("kind", "cron", "every", "at"),
    "action": ("action_ref",),
}


def patch_params(name: str, row: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The checked arguments of ``patch_schedule``: the changes merged into the stored row
    are checked as a whole (create_params), then only the columns changed are named, so
    the function, which locks the row, keeps what a concurrent PATCH changed meanwhile."""
    params = create_params(name, patched(row, changes), replace=True)
    del params["replace"]
    fields = {c for k in changes for c in _COLUMNS.get(k, (k,))}
    return {**params, "fields": sorted(fields)}


def next_fire_times(row: Mapping[str, Any], count: int) -> list[datetime]:
    """The next ``count`` slots of a stored schedule from the database's now (``row['now']``)."""
    spec = sch.Spec.from_row(row)
    after = max(sch.first_after(spec, row["last_slot"], row["updated"]), row["now"] - sch.ON_TIME)
    return sch.upcoming(spec, after, max(0, min(count, MAX_NEXT)))


def view(row: Mapping[str, Any], count: int = 5, slots: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A schedule as shown: durations in seconds, the next fire times, recent slots."""
    out = {k: v for k, v in row.items() if k != "now"}
    out["every"] = row["every"].total_seconds() if row["every"] is not None else None
    out["catchup_window"] = row["catchup_window"].total_seconds()
    out["next_fire_times"] = next_fire_times(row, count)
    if slots is not None:
        out["slots"] = [dict(s) for s in slots]
    return out


def backfill_slots(row: Mapping[str, Any], since: datetime | str, until: datetime | str) -> list[datetime]:
    spec = sch.Spec.from_row(row)
    start = instant(since, "since", row["timezone"])
    end = instant(until, "until", row["timezone"])
    assert start is not None
    assert end is not None
    return sch.slots_between(spec, start, end)


def changed(name: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """What pause_schedule / resume_schedule answered (no row: no such schedule)."""
    if row is None:
        raise not_found(name)
    return {"name": name, "id": row["schedule_id"], "was_paused": row["was"]}


# -- the verbs ----------------------------------------------------------------------------


def read(name: str, count: int = 5, slots: int = 20) -> Verb[dict[str, Any]]:
    """One schedule as shown (:func:`view`): its next ``count`` fire times and its
    ``slots`` most recent slots. A read, also the answer of create and patch."""
    row = yield from _row(name)
    recent = yield sql("schedule_slots", {"id": row["id"], "limit": slots}, "all")
    return view(row, count, recent)


def _row(name: str) -> Verb[Row]:
    row = yield sql("get_schedule", {"name": name})
    if row is None:
        raise not_found(name)
    return dict(row)


def create(name: str, fields: Mapping[str, Any], *, replace: bool = False) -> Verb[dict[str, Any]]:
    """``create_schedule`` (``replace``: create or replace; else a name taken is a
    ConflictError); the schedule as shown."""
    params = create_params(name, fields, replace=replace)
    with refusals(action_ref=fields.get("action") or ""):
        yield sql("create_schedule", params)
    return (yield from read(name))


def patch(name: str, changes: Mapping[str, Any]) -> Verb[dict[str, Any]]:
    """``patch_schedule``: the changes, checked against the row as read, applied to the
    row locked -- only the fields given, so a concurrent PATCH of other fields is kept."""
    row = yield from _row(name)
    params = patch_params(name, row, changes)
    with refusals(action_ref=changes.get("action") or row["action_ref"] or ""):
        yield sql("patch_schedule", params)
    return (yield from read(name))


def pause(name: str) -> Verb[dict[str, Any]]:
    """``pause_schedule``: ``{"name", "id", "was_paused"}``."""
    return changed(name, (yield sql("pause_schedule", {"name": name})))


def resume(name: str) -> Verb[dict[str, Any]]:
    """``resume_schedule`` (from now: the slots while paused are not fired)."""
    return changed(name, (yield sql("resume_schedule", {"name": name})))


def delete(name: str) -> Verb[None]:
    """``delete_schedule`` with its slot rows (the executions and events it made stay)."""
    row = yield sql("delete_schedule", {"name": name})
    if not row or not row["deleted"]:
        raise not_found(name)


def fire(name: str) -> Verb[list[Row]]:
    """``fire_schedule`` (origin manual): the slot fired, none if one was fired at this
    very instant."""
    with refusals():
        rows = yield sql("fire_schedule", {"name": name}, "all")
    return [dict(r) for r in rows]


def backfill(name: str, since: datetime | str, until: datetime | str) -> Verb[list[Row]]:
    """``backfill_schedule``: the slots of [since, until) not fired yet (origin
    backfill), read in the schedule's time zone; the slots fired now."""
    slots = backfill_slots((yield from _row(name)), since, until)
    with refusals():
        rows = yield sql("backfill_schedule", {"name": name, "slots": slots}, "all")
    return [dict(r) for r in rows]
