"""Dead-letter verbs (an operator's): replay a letter -- publish it again to where it was
going, checked with the consumers' own rules first so a replay is not simply rejected
again -- and purge records, each one SQL function (``replay_dead_letter``,
``purge_dead_letters``, migration 0035), run by ``drive.run`` (SDK, CLI) and
``drive.run_async`` (API). Replaying many is replaying each in its own transaction: what
was replayed before a failure stays replayed."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain.dead_letters import Resolution
from conveyor.domain.errors import ConveyorError
from conveyor.domain.ids import is_id
from conveyor.store.db import Row
from conveyor.transport import messages as m
from conveyor.verbs.drive import Verb, sql


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


def replay(dead_letter_id: int, *, by: str, skip_replayed: bool) -> Verb[Outcome]:
    """Check the letter with the consumers' rules, then ``replay_dead_letter`` locks it,
    publishes it again through the transport in use (a NOTIFY, or an outbox row for the
    relay) and marks it replayed. Answers what happened to it: a letter that cannot be
    replayed is an ``error``, one replayed meanwhile (with ``skip_replayed``) ``skipped``."""
    missing = Outcome(dead_letter_id, error=f"no dead letter with id {dead_letter_id}")
    row = (yield sql("get_dead_letter", {"id": dead_letter_id})) if is_id(dead_letter_id) else None
    if row is None:
        return missing
    if skip_replayed and row["resolution"] == Resolution.REPLAYED:
        return Outcome(dead_letter_id, skipped="replayed meanwhile by someone else")
    try:
        # The body and routing key of a letter never change: checked on the row as read.
        routing_key, message_type, inner = replayable(row)
    except NotReplayableError as exc:
        return Outcome(dead_letter_id, error=f"dead letter {dead_letter_id} cannot be replayed: {exc}")
    params = {
        "id": dead_letter_id,
        "by": by,
        "skip_replayed": skip_replayed,
        "routing_key": routing_key,
        "message_type": message_type,
        "payload": Jsonb(inner),
    }
    done = yield sql("replay_dead_letter", params)
    if done is None or done["outcome"] == "missing":  # purged between the read and the lock
        return missing
    if done["outcome"] == "skipped":
        return Outcome(dead_letter_id, skipped="replayed meanwhile by someone else")
    return Outcome(dead_letter_id, routing_key=routing_key)


@dataclass(frozen=True, slots=True)
class PurgeFilters:
    """Which records a purge deletes: the listing's filters (``older_than``: first seen
    longer ago, in seconds), resolved ones only unless ``include_pending``."""

    reason: str | None = None
    resolution: str | None = None
    execution: int | None = None
    queue: str | None = None
    older_than: float | None = None
    include_pending: bool = False

    @property
    def given(self) -> bool:
        """Any filter (a purge without one deletes every resolved record: the caller asks)."""
        return any(v is not None for v in (self.reason, self.resolution, self.execution, self.queue, self.older_than))

    def params(self) -> dict[str, Any]:
        """The parameters of ``purge_dead_letters`` and ``count_purgeable_dead_letters``."""
        return dataclasses.asdict(self)


def purge(filters: PurgeFilters) -> Verb[int]:
    """Delete the records ``filters`` match; answers how many were deleted."""
    rows = yield sql("purge_dead_letters", filters.params(), "all")
    return len(rows)
