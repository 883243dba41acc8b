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

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from conveyor.domain import events as ev
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.store.queries import Q
from conveyor.verbs import common as verbs


@contextmanager
def _savepoint(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A savepoint in the caller's transaction, whose refusals are raised as ConveyorErrors
    after it is rolled back (the caller's transaction stays usable). psycopg's
    ``transaction()`` on an idle connection that is not autocommit would BEGIN and COMMIT a
    transaction of its own -- committing what the caller may yet roll back -- so the
    caller's transaction is begun first, as its next statement would begin it."""
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        conn.execute("SELECT 1")
    with verbs.refusals(), conn.transaction():
        yield


def _payload_schema(cur: psycopg.Cursor[Any], trigger: str, schema: str) -> dict[str, Any] | None:
    if not ev.valid_trigger_name(trigger):
        raise ev.trigger_not_found(trigger)
    cur.execute(sql.SQL("SELECT payload_schema FROM {}.trigger WHERE name = %s").format(sql.Identifier(schema)),
                (trigger,))  # fmt: skip
    row = cur.fetchone()
    if row is None:
        raise ev.trigger_not_found(trigger)
    return None if row[0] is None else dict(row[0])


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
    check_idempotency_key(idempotency_key)
    # A savepoint: a refusal (CVE01/CVE02/CVE03) is raised as a ConveyorError and leaves
    # the caller's transaction usable, as a refusal found here first does.
    with _savepoint(conn), conn.cursor(row_factory=tuple_row) as cur:
        ev.check_payload(trigger, _payload_schema(cur, trigger, schema), body)
        cur.execute(
            sql.SQL("SELECT event_id, repeated FROM {}.emit_event_once(%s, %s, %s, %s)").format(sql.Identifier(schema)),
            (trigger, Jsonb(body), source, idempotency_key),
        )
        row = cur.fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


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
    ev.check_trigger(name, payload_schema, description)
    with _savepoint(conn), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(
            sql.SQL("SELECT {}.register_trigger(%s, 'custom', %s, %s)").format(sql.Identifier(schema)),
            (name, None if payload_schema is None else Jsonb(payload_schema), description),
        )
        row = cur.fetchone()
    assert row is not None
    return bool(row[0])


def delete_trigger(conn: psycopg.Connection[Any], name: str, *, schema: str = "conveyor") -> None:
    """Delete a trigger; NotFoundError when there is none, ConflictError while rules,
    webhooks, schedules or events use it."""
    if not ev.valid_trigger_name(name):
        raise ev.trigger_not_found(name)
    with _savepoint(conn), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sql.SQL("SELECT {}.delete_trigger(%s)").format(sql.Identifier(schema)), (name,))
        row = cur.fetchone()
    if row is None or not row[0]:
        raise ev.trigger_not_found(name)


def replay_event(conn: psycopg.Connection[Any], event_id: int, *, schema: str = "conveyor") -> int:
    """A new event with the original's trigger and payload (``replay_of`` names it): its
    rules are evaluated again. Returns the new id; NotFoundError when there is no such event."""
    if not ev.valid_id(event_id):
        raise ev.event_not_found(event_id)
    with _savepoint(conn), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sql.SQL("SELECT {}.replay_event(%s)").format(sql.Identifier(schema)), (event_id,))
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


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
    if not ev.valid_trigger_name(trigger):
        raise ev.trigger_not_found(trigger)
    verbs.check_window(since, until)
    with _savepoint(conn), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(
            sql.SQL("SELECT original, replay FROM {}.replay_events(%s, %s, coalesce(%s::timestamptz, now()))").format(
                sql.Identifier(schema)
            ),
            (trigger, since, until),
        )
        return [(int(r[0]), int(r[1])) for r in cur.fetchall()]


class EventMethods:
    """Part of :class:`conveyor.sdk.Client` (its connection: autocommit, search_path set)."""

    conn: psycopg.Connection[Any]
    schema: str

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
        return register_trigger(self.conn, name, payload_schema, description, schema=self.schema)

    def delete_trigger(self, name: str) -> None:
        delete_trigger(self.conn, name, schema=self.schema)

    def emit_event(
        self, trigger: str, payload: Any = None, *, idempotency_key: str | None = None, source: str = "sdk"
    ) -> dict[str, Any]:
        """Emit in a transaction of its own: ``{"id", "repeated"}``."""
        eid, repeated = emit_event_once(
            self.conn, trigger, payload, idempotency_key=idempotency_key, source=source, schema=self.schema
        )
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
        params = {"trigger": trigger, "source": source, "since": since, "until": until, "before": before,
                  "limit": limit}  # fmt: skip
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
        return replay_event(self.conn, event_id, schema=self.schema)

    def replay_events(self, trigger: str, since: datetime, until: datetime | None = None) -> list[tuple[int, int]]:
        return replay_events(self.conn, trigger, since, until, schema=self.schema)

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
