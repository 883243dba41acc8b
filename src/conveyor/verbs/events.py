"""Triggers and events (issue #13): register and delete a custom trigger, emit an event,
replay one event or a trigger's time window. One SQL function each (migration 0016:
``register_trigger``, ``delete_trigger``, ``emit_event_once``, ``replay_event``,
``replay_events``) and one body each, run by ``drive.run`` (SDK, CLI) and
``drive.run_async`` (API). The checks of names, schemas and payloads are the domain's
(domain/events.py); what is here is the sequence around the one call and what its answer
means."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain import events as ev
from conveyor.domain.delays import DelayError, check_aware
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.verbs.common import refusals
from conveyor.verbs.drive import Verb, sql


def register_trigger(name: str, payload_schema: Any = None, description: str | None = None) -> Verb[bool]:
    """Create or update the custom trigger ``name`` (True: created). ``payload_schema`` (a
    JSON Schema, checked to be one; None: any JSON) is what its events' payloads must
    satisfy. A trigger of another type (webhook, cron...) keeps its name: ConflictError."""
    ev.check_trigger(name, payload_schema, description)
    schema = None if payload_schema is None else Jsonb(payload_schema)
    params = {"name": name, "type": "custom", "payload_schema": schema, "description": description}
    with refusals():
        row = yield sql("register_trigger", params)
    assert row is not None  # the function returns a boolean or raises
    return bool(row["created"])


def delete_trigger(name: str) -> Verb[None]:
    """NotFoundError when there is none; ConflictError while rules, webhooks, schedules or
    events use it."""
    if not ev.valid_trigger_name(name):
        raise ev.trigger_not_found(name)
    with refusals():
        row = yield sql("delete_trigger", {"name": name})
    if row is None or not row["deleted"]:
        raise ev.trigger_not_found(name)


def emit(trigger: str, payload: Any, source: str, idempotency_key: str | None = None) -> Verb[tuple[int, bool]]:
    """An event on ``trigger``: ``(event_id, repeated)``, ``repeated`` when the key was used
    before for this trigger and payload (the first event's id). The payload is checked
    against the trigger's JSON Schema first (InvalidPayloadError names each path); an
    unknown trigger is a NotFoundError, the key reused with another payload a ConflictError."""
    check_idempotency_key(idempotency_key)
    if not ev.valid_trigger_name(trigger):
        raise ev.trigger_not_found(trigger)
    found = yield sql("trigger_schema", {"name": trigger})
    if found is None:
        raise ev.trigger_not_found(trigger)
    ev.check_payload(trigger, found["payload_schema"], payload)
    params = {"trigger": trigger, "payload": Jsonb(payload), "source": source, "key": idempotency_key}
    with refusals():
        row = yield sql("emit_event", params)
    assert row is not None  # the function returns a row or raises
    return int(row["event_id"]), bool(row["repeated"])


def replay_event(event_id: int) -> Verb[int]:
    """A new event with the original's trigger and payload (``replay_of`` names it): its
    rules are evaluated again. The new id; NotFoundError when there is no such event."""
    if not ev.valid_id(event_id):
        raise ev.event_not_found(event_id)
    with refusals():
        row = yield sql("replay_event", {"id": event_id})
    assert row is not None
    return int(row["id"])


def replay_events(trigger: str, since: datetime, until: datetime | None = None) -> Verb[list[tuple[int, int]]]:
    """One replay for each event of ``trigger`` received in [since, until) (until: the
    database's now()), oldest first, as (original, replay) pairs. Replays are not replayed."""
    if not ev.valid_trigger_name(trigger):
        raise ev.trigger_not_found(trigger)
    check_window(since, until)
    with refusals():
        rows = yield sql("replay_events", {"trigger": trigger, "since": since, "until": until}, "all")
    return [(int(r["original"]), int(r["replay"])) for r in rows]


def check_window(since: datetime, until: datetime | None) -> None:
    """A replay window: timezone-aware times, ``since`` before ``until``."""
    for what, when in (("since", since), ("until", until)):
        if when is not None:
            check_aware(when, what)
    if until is not None and until <= since:
        raise DelayError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})")
