"""What the dashboard shows of automation (issue #13): events, enforcements, rules,
triggers and webhooks, schedules and their slots, read straight from the tables of
migration 0016 with the named queries of ``dashboard_automation.sql``. The engines that
fill them (rules, webhooks, schedules) are elsewhere; these pages only read.

A schedule's next fire times are the engine's own (conveyor.domain.schedules, through
verbs.schedules.next_fire_times as the CLI and REST show them), from the database clock --
display only, never a decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from conveyor.api.dashboard.data import FINISHED, PAGE, NotFound, Shown, _choice, _id, _text
from conveyor.api.dashboard.web import pretty
from conveyor.domain.ids import parse_id
from conveyor.domain.schedules import InvalidScheduleError
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q
from conveyor.verbs.schedules import next_fire_times

OUTCOMES = ("requested", "template_error", "request_error", "rule_disabled")
SLOT_OUTCOMES = ("requested", "emitted", "skipped", "missed", "buffered", "request_error")
DETAIL_ROWS = 20  # enforcements, replays and slots on one event's, rule's or schedule's page
UPCOMING = 3  # fire times shown per schedule


@dataclass(slots=True)
class EventFilters:
    trigger: str | None = None
    before: int | None = None
    problems: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> EventFilters:
        problems: list[str] = []
        before = _id(params, "before", problems)
        return cls(_text(params, "trigger"), before, problems)

    def query(self, **changes: Any) -> str:
        values = {"trigger": self.trigger, "before": self.before, **changes}
        return urlencode({k: v for k, v in values.items() if v is not None})


@dataclass(slots=True)
class EnforcementFilters:
    outcome: str | None = None
    rule: str | None = None
    before: int | None = None
    problems: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> EnforcementFilters:
        problems: list[str] = []
        outcome = _choice(params, "outcome", OUTCOMES, problems)
        before = _id(params, "before", problems)
        return cls(outcome, _text(params, "rule"), before, problems)

    def query(self, **changes: Any) -> str:
        values = {"outcome": self.outcome, "rule": self.rule, "before": self.before, **changes}
        return urlencode({k: v for k, v in values.items() if v is not None})


def positive_id(raw: str, what: str) -> int:
    """A path's id, or NotFound (a 404) for anything that is not one."""
    value = parse_id(raw)
    if value is None:
        raise NotFound(f"no {what} {raw[:64]}")
    return value


# -- events -----------------------------------------------------------------------------


async def events(conn: AsyncConn, filters: EventFilters, page: bool = True) -> dict[str, Any]:
    """The page (``page``: with its filter's choices) or its live part (the rows only)."""
    params = {"trigger": filters.trigger, "before": filters.before, "limit": PAGE}
    rows = await (await conn.execute(Q["dash_events"], params)).fetchall()
    older = filters.query(before=rows[-1]["id"]) if len(rows) == PAGE else None
    values = {"events": rows, "older": older, "filters": filters}
    if page:
        values["triggers"] = [t["name"] for t in await (await conn.execute(Q["dash_trigger_names"])).fetchall()]
    return values


async def event(conn: AsyncConn, eid: int) -> dict[str, Any]:
    row = await (await conn.execute(Q["dash_event"], {"id": eid})).fetchone()
    if row is None:
        raise NotFound(f"no event {eid}")
    params = {"outcome": None, "rule_ref": None, "event": eid, "before": None, "limit": PAGE}
    enforcements = await (await conn.execute(Q["dash_enforcements"], params)).fetchall()
    replays = await (await conn.execute(Q["dash_event_replays"], {"id": eid, "limit": DETAIL_ROWS})).fetchall()
    # Final once its rules were evaluated and each execution it requested has finished
    # (a later replay of it then shows when the page is loaded again).
    final = not row["pending"] and all(
        f["execution_status"] in FINISHED or f["execution_status"] is None  # None: purged since
        for f in enforcements
        if f["execution"]
    )
    return {
        "event": row,
        "payload": Shown.of(pretty(row["payload"])),
        "enforcements": enforcements,
        "replays": replays,
        "final": final,
    }


async def enforcements(conn: AsyncConn, filters: EnforcementFilters, page: bool = True) -> dict[str, Any]:
    params = {
        "outcome": filters.outcome,
        "rule_ref": filters.rule,
        "event": None,
        "before": filters.before,
        "limit": PAGE,
    }
    rows = await (await conn.execute(Q["dash_enforcements"], params)).fetchall()
    older = filters.query(before=rows[-1]["id"]) if len(rows) == PAGE else None
    values = {"enforcements": rows, "older": older, "filters": filters, "outcomes": OUTCOMES}
    if page:
        values["rules"] = [r["ref"] for r in await (await conn.execute(Q["dash_rule_refs"])).fetchall()]
    return values


# -- rules, triggers, webhooks ----------------------------------------------------------


async def rules(conn: AsyncConn) -> dict[str, Any]:
    return {"rules": await (await conn.execute(Q["dash_rules"])).fetchall()}


async def rule(conn: AsyncConn, ref: str) -> dict[str, Any]:
    row = await (await conn.execute(Q["dash_rule"], {"ref": ref})).fetchone()
    if row is None:
        raise NotFound(f"no rule {ref[:255]}")
    params = {"outcome": None, "rule_ref": ref, "event": None, "before": None, "limit": DETAIL_ROWS}
    recent = await (await conn.execute(Q["dash_enforcements"], params)).fetchall()
    return {
        "rule": row,
        "criteria": Shown.of(pretty(row["criteria"])),
        "parameters": Shown.of(pretty(row["parameters"])),
        "enforcements": recent,
    }


async def triggers(conn: AsyncConn) -> dict[str, Any]:
    rows = await (await conn.execute(Q["dash_triggers"])).fetchall()
    shown = [
        {**t, "schema": None if t["payload_schema"] is None else Shown.of(pretty(t["payload_schema"]))} for t in rows
    ]
    return {"triggers": shown, "webhooks": await (await conn.execute(Q["dash_webhooks"])).fetchall()}


# -- schedules --------------------------------------------------------------------------


def upcoming(schedule: Mapping[str, Any], now: datetime, count: int = UPCOMING) -> list[datetime]:
    """The schedule's next ``count`` fire times, exactly as ``conveyor schedules get`` and
    REST show them (verbs.schedules.next_fire_times: the engine's slot arithmetic in
    conveyor.domain.schedules) from ``now``, the database clock. One implementation: a
    second one here (croniter read directly) showed a different instant for a slot in a
    spring-forward gap than the one the engine fires. Nothing for a row the engine could
    not read either (written around the API). Pure: display only."""
    try:
        return next_fire_times({**schedule, "now": now}, count)
    except (InvalidScheduleError, KeyError):
        return []


def _schedule_view(row: Mapping[str, Any]) -> dict[str, Any]:
    now: datetime = row["db_now"]
    next_fire = row["next_fire"]
    overdue = None if row["paused"] or next_fire is None else max(0.0, (now - next_fire).total_seconds())
    expression = {"cron": row.get("cron"), "interval": row.get("every"), "date": row.get("at")}.get(row["kind"])
    return {**row, "upcoming": upcoming(row, now), "overdue": overdue, "expression": expression}


async def schedules(conn: AsyncConn) -> dict[str, Any]:
    rows = await (await conn.execute(Q["dash_schedules"])).fetchall()
    return {"schedules": [_schedule_view(r) for r in rows]}


async def schedule(conn: AsyncConn, name: str) -> dict[str, Any]:
    row = await (await conn.execute(Q["dash_schedule"], {"name": name})).fetchone()
    if row is None:
        raise NotFound(f"no schedule {name[:255]}")
    slots = await (await conn.execute(Q["dash_schedule_slots"], {"id": row["id"], "limit": DETAIL_ROWS})).fetchall()
    return {"schedule": _schedule_view(row), "parameters": Shown.of(pretty(row["parameters"])), "slots": slots}
