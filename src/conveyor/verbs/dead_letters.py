"""Replaying dead letters (CLI and API): publish a letter again to where it was going,
checked with the consumers' own rules first so a replay is not simply rejected again."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.domain.dead_letters import Resolution
from conveyor.domain.errors import ConveyorError
from conveyor.store.db import Row
from conveyor.store.queries import Q
from conveyor.transport import messages as m


class NotReplayableError(ConveyorError):
    """A dead letter that cannot be published again as it is."""


def replayable(row: Row) -> tuple[str, str, dict[str, Any]]:
    """(routing key, message type, inner payload) to publish again, checked with the
    consumers' own rules so a replayed message is not simply rejected again."""
    payload = row["payload"]
    if row["resolution"] == Resolution.INVALID or not isinstance(payload, dict) or "raw" in payload:
        raise NotReplayableError("its body is not a Conveyor message (resolution invalid); inspect it with `show`")
    try:
        envelope = m.decode(json.dumps(payload).encode())
        if envelope.message_type == m.SCHEDULED:
            expected = m.Names.worker_key(m.Dispatch.of(envelope).worker_id)
        else:
            envelope.ids("worker_ids" if envelope.message_type == m.CAPACITY else "execution_ids")
            expected = envelope.message_type  # doorbells are routed by their type
    except m.InvalidMessageError as exc:
        raise NotReplayableError(f"its body is not a valid Conveyor message: {exc}") from None
    routing_key = row["routing_key"] or expected
    if routing_key != expected:
        raise NotReplayableError(
            f"its routing key {routing_key!r} does not match its {envelope.message_type} message "
            f"(expected {expected!r})"
        )
    return routing_key, envelope.message_type, envelope.payload


@dataclass(frozen=True, slots=True)
class Outcome:
    id: int
    routing_key: str | None = None
    error: str | None = None
    skipped: str | None = None


async def replay_one(
    conn: psycopg.AsyncConnection[Row], dead_letter_id: int, *, by: str, skip_replayed: bool
) -> Outcome:
    """Inside ``conn``'s transaction: check the letter with the consumers' rules, then
    ``replay_dead_letter`` (migration 0035) locks it, publishes it again through the
    transport in use (a NOTIFY, or an outbox row for the relay) and marks it replayed."""
    row = await (await conn.execute(Q["get_dead_letter"], {"id": dead_letter_id})).fetchone()
    if row is None:
        return Outcome(dead_letter_id, error=f"no dead letter with id {dead_letter_id}")
    if skip_replayed and row["resolution"] == Resolution.REPLAYED:
        return Outcome(dead_letter_id, skipped="replayed meanwhile by someone else")
    try:
        # The body and routing key of a letter never change: checked on the row as read.
        routing_key, message_type, inner = replayable(row)
    except NotReplayableError as exc:
        return Outcome(dead_letter_id, error=f"dead letter {dead_letter_id} cannot be replayed: {exc}")
    params = {"id": dead_letter_id, "by": by, "skip_replayed": skip_replayed, "routing_key": routing_key,
              "message_type": message_type, "payload": Jsonb(inner)}  # fmt: skip
    done = await (await conn.execute(Q["replay_dead_letter"], params)).fetchone()
    if done is None or done["outcome"] == "missing":  # purged between the read and the lock
        return Outcome(dead_letter_id, error=f"no dead letter with id {dead_letter_id}")
    if done["outcome"] == "skipped":
        return Outcome(dead_letter_id, skipped="replayed meanwhile by someone else")
    return Outcome(dead_letter_id, routing_key=routing_key)
