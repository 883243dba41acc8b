"""The SDK's triggers, events and enforcements (issue #13). Each change is one SQL function
of migration 0016 (``register_trigger``, ``delete_trigger``, ``emit_event_once``,
``replay_event``, ``replay_events``); the checks around it are shared with the API and the
CLI (domain/events.py, verbs.py).

Emit inside your own transaction, as you request executions: the event exists (and the
executors hear of it) if and only if your transaction commits.

    import psycopg
    from conveyor.sdk.events import emit_event

    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO deploys ...")
        event_id = emit_event(conn, "deploys", {"service": "api", "version": "1.2"})

or through a :class:`conveyor.sdk.Client` (its own transaction): ``client.emit_event(...)``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from conveyor.domain import events as ev
from conveyor.sdk.callers import in_callers_transaction
from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import events as event_verbs
from conveyor.verbs.drive import run


def emit_event_once(
    conn: psycopg.Connection[Any],
    trigger: str,
    payload: Any = None,
    *,
    idempotency_key: str | None = None,
    source: str = "sdk",
    schema: str = "conveyor",
) -> tuple[int, bool]:
    """:func:`emit_event`, answering ``(event_id, repeated)``: ``repeated`` when the key
    was used before for this trigger and payload (the first event's id)."""
    body = {} if payload is None else payload
    return in_callers_transaction(conn, schema, event_verbs.emit(trigger, body, source, idempotency_key))


def emit_event(
    conn: psycopg.Connection[Any],
    trigger: str,
    payload: Any = None,
    *,
    idempotency_key: str | None = None,
    source: str = "sdk",
    schema: str = "conveyor",
) -> int:
    """Emit an event on ``trigger`` within ``conn``'s current transaction; returns its id.
    The payload is checked against the trigger's JSON Schema (InvalidPayloadError names
    each problem's path); an unknown trigger raises NotFoundError. With
    ``idempotency_key``, a retry with the same key and payload returns the first event;
    the key with another payload raises ConflictError."""
    return emit_event_once(conn, trigger, payload, idempotency_key=idempotency_key, source=source, schema=schema)[0]


def register_trigger(
    conn: psycopg.Connection[Any],
    name: str,
    payload_schema: dict[str, Any] | None = None,
    description: str | None = None,
    *,
    schema: str = "conveyor",
) -> bool:
    """Create or update the custom trigger ``name`` (True: created). ``payload_schema``
    (a JSON Schema, checked to be one) is what every event's payload must satisfy; None
    accepts any JSON. A trigger of another type (webhook, cron...) keeps it: ConflictError."""
    return in_callers_transaction(conn, schema, event_verbs.register_trigger(name, payload_schema, description))


def delete_trigger(conn: psycopg.Connection[Any], name: str, *, schema: str = "conveyor") -> None:
    """Delete a trigger; NotFoundError when there is none, ConflictError while rules,
    webhooks, schedules or events use it."""
    in_callers_transaction(conn, schema, event_verbs.delete_trigger(name))


def replay_event(conn: psycopg.Connection[Any], event_id: int, *, schema: str = "conveyor") -> int:
    """A new event with the original's trigger and payload (``replay_of`` names it): its
    rules are evaluated again. Returns the new id; NotFoundError when there is no such event."""
    return in_callers_transaction(conn, schema, event_verbs.replay_event(event_id))


def replay_events(
    conn: psycopg.Connection[Any],
    trigger: str,
    since: datetime,
    until: datetime | None = None,
    *,
    schema: str = "conveyor",
) -> list[tuple[int, int]]:
    """One replay for each event of ``trigger`` received in [since, until) (until: the
    database's now()), oldest first, as (original, replay) pairs. Replays are not replayed."""
    return in_callers_transaction(conn, schema, event_verbs.replay_events(trigger, since, until))


class EventMethods:
    """Part of :class:`conveyor.sdk.Client` (its connection: autocommit, search_path set)."""

    conn: Conn
    schema: str

    def ago(self, interval: timedelta) -> datetime:
        """The database's now() less ``interval`` (a window's start given as a duration
        ago: by the clock that stamps the events, not this machine's)."""
        row = self.conn.execute(Q["database_time_ago"], {"ago": interval}).fetchone()
        assert row is not None
        at: datetime = row["at"]
        return at

    def triggers(self) -> list[dict[str, Any]]:
        """Every trigger, by name, with its rule count and newest event's time."""
        return list(self.conn.execute(Q["list_triggers"]).fetchall())

    def trigger(self, name: str) -> dict[str, Any]:
        row = self.conn.execute(Q["get_trigger"], {"name": name}).fetchone() if ev.valid_trigger_name(name) else None
        if row is None:
            raise ev.trigger_not_found(name)
        return dict(row)

    def register_trigger(
        self, name: str, payload_schema: dict[str, Any] | None = None, description: str | None = None
    ) -> bool:
        return run(self.conn, event_verbs.register_trigger(name, payload_schema, description))

    def delete_trigger(self, name: str) -> None:
        run(self.conn, event_verbs.delete_trigger(name))

    def emit_event(
        self, trigger: str, payload: Any = None, *, idempotency_key: str | None = None, source: str = "sdk"
    ) -> dict[str, Any]:
        """Emit in a transaction of its own: ``{"id", "repeated"}``."""
        body = {} if payload is None else payload
        eid, repeated = run(self.conn, event_verbs.emit(trigger, body, source, idempotency_key))
        return {"id": eid, "repeated": repeated}

    def events(
        self,
        *,
        trigger: str | None = None,
        source: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
        before: int | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; ``before`` (an id) pages."""
        params = {
            "trigger": trigger,
            "source": source,
            "since": since,
            "until": until,
            "before": before,
            "limit": limit,
        }
        return list(self.conn.execute(Q["list_events"], params).fetchall())

    def event(self, event_id: int) -> dict[str, Any]:
        """One event with ``enforcements`` (what its rules decided) and ``replays``."""
        row = self.conn.execute(Q["get_event"], {"id": event_id}).fetchone() if ev.valid_id(event_id) else None
        if row is None:
            raise ev.event_not_found(event_id)
        enforcements = self.conn.execute(Q["event_enforcements"], {"id": event_id}).fetchall()
        replays = self.conn.execute(Q["event_replays"], {"id": event_id}).fetchall()
        return {**row, "enforcements": enforcements, "replays": replays}

    def replay_event(self, event_id: int) -> int:
        return run(self.conn, event_verbs.replay_event(event_id))

    def replay_events(self, trigger: str, since: datetime, until: datetime | None = None) -> list[tuple[int, int]]:
        return run(self.conn, event_verbs.replay_events(trigger, since, until))

    def enforcements(
        self,
        *,
        rule: str | None = None,
        event: int | None = None,
        outcome: str | None = None,
        since: datetime | None = None,
        limit: int = 50,
        before: int | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; ``rule`` is a rule's ref (kept after the rule is deleted)."""
        params = {"rule": rule, "event": event, "outcome": outcome, "since": since, "before": before, "limit": limit}
        return list(self.conn.execute(Q["list_enforcements"], params).fetchall())

    def enforcement(self, enforcement_id: int) -> dict[str, Any]:
        found = ev.valid_id(enforcement_id)
        row = self.conn.execute(Q["get_enforcement"], {"id": enforcement_id}).fetchone() if found else None
        if row is None:
            raise ev.enforcement_not_found(enforcement_id)
        return dict(row)
