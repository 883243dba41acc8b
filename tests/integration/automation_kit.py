"""Automation rows for the dashboard tests, written as the engines would leave them: the
0016 verbs where they exist (register_trigger, emit_event, register_rule, replay_event)
and, as plain test setup, INSERTs into enforcement, schedule and schedule_slot (the rules
and schedules engines are built elsewhere; these pages only read their tables). The SQL
is plain strings so the acceptance tests (synchronous psycopg) use the same setup."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from integration.api_kit import Api

# An enforcement that requested an execution: the execution names the enforcement and
# the enforcement the execution, so the id is taken from the identity's sequence first.
NEXT_ENFORCEMENT = "SELECT nextval(pg_get_serial_sequence('enforcement', 'id')) AS id"
REQUEST_FOR = "SELECT request_execution(%s, %s, enforcement => %s) AS id"
INSERT_ENFORCEMENT = (
    "INSERT INTO enforcement (id, rule, rule_ref, event, outcome, execution, parameters, error)"
    " OVERRIDING SYSTEM VALUE VALUES (%s, (SELECT id FROM rule WHERE ref = %s), %s, %s, %s, %s, %s, %s)"
)
# Rules evaluated: the event leaves the work queue as the rules engine's transaction does.
EVALUATED = "DELETE FROM event_pending WHERE event = %s"
INSERT_SCHEDULE = (
    "INSERT INTO schedule (name, kind, cron, timezone, every, action_ref, trigger, overlap, catchup, paused,"
    " next_fire) VALUES (%s, %s, %s, %s, %s::interval, %s, %s, %s, %s, %s, now() + %s::interval) RETURNING id"
)
INSERT_SLOT = (
    "INSERT INTO schedule_slot (schedule, slot, origin, outcome, execution, error, fired)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


async def emit(api: Api, trigger: str, payload: Any, source: str = "api") -> int:
    row = await api.one("SELECT emit_event(%s, %s, %s) AS id", (trigger, Jsonb(payload), source))
    return int(row["id"])


async def enforce(
    api: Api, rule: str, event: int, action: str | None = "core.echo", error: str | None = None, **params: Any
) -> tuple[int, int | None]:
    """Record rule ``rule``'s decision on ``event``: a request of ``action`` (the
    (enforcement, execution) ids), or with action None the outcome ``error`` names."""
    fid = int((await api.one(NEXT_ENFORCEMENT))["id"])
    execution = None
    outcome = "requested"
    if action is not None:
        execution = int((await api.one(REQUEST_FOR, (action, Jsonb(params or {"message": "hi"}), fid)))["id"])
    else:
        outcome = "template_error"
    await api.sql(INSERT_ENFORCEMENT, (fid, rule, rule, event, outcome, execution, Jsonb(params), error))
    await api.sql(EVALUATED, (event,))
    return fid, execution


async def schedule(api: Api, name: str, kind: str = "cron", *, cron: str | None = "*/5 * * * *",
                   every: str | None = None, timezone: str = "UTC", action: str | None = "core.echo",
                   trigger: str | None = None, paused: bool = False, next_in: str = "5 minutes") -> int:  # fmt: skip
    row = await api.one(INSERT_SCHEDULE, (name, kind, cron, timezone, every, action, trigger, "skip", "latest",
                                          paused, next_in))  # fmt: skip
    return int(row["id"])
