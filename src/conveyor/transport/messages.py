"""Message names, the envelope, and the dead-letter record -- shared by both transports.

Routing keys and message types follow the seeds (``execution.requested``,
``execution.scheduled``, ``execution.completed``); the names of exchanges and queues
are built from ``message_queue.prefix`` (default ``conveyor``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from conveyor.domain import jsontext
from conveyor.domain.dead_letters import REASONS as _REASONS
from conveyor.transport.base import Topic

REQUESTED = "execution.requested"
SCHEDULED = "execution.scheduled"
COMPLETED = "execution.completed"
CAPACITY = "worker.capacity"
DOORBELL_KEYS = {Topic.REQUESTED: REQUESTED, Topic.CAPACITY: CAPACITY, Topic.COMPLETED: COMPLETED}
KNOWN_TYPES = frozenset({REQUESTED, SCHEDULED, COMPLETED, CAPACITY})

# Dead-letter reasons as recorded (domain.dead_letters); RabbitMQ's x-death reasons map onto them.
REASONS = _REASONS
_BROKER_REASONS = {
    "expired": "expired",
    "rejected": "rejected",
    "maxlen": "rejected",
    "delivery_limit": "max_redeliveries",
}


@dataclass(frozen=True, slots=True)
class Names:
    prefix: str
    dlx: str

    @property
    def executions(self) -> str:
        return f"{self.prefix}.executions"

    @property
    def events(self) -> str:
        return f"{self.prefix}.events"

    @property
    def dlq(self) -> str:
        return f"{self.dlx}.queue"

    @property
    def executor_queue(self) -> str:
        return f"{self.prefix}.executor.requests"

    def worker_queue(self, worker_id: int) -> str:
        return f"{self.prefix}.worker.{worker_id}.executions"

    @staticmethod
    def worker_key(worker_id: int) -> str:
        return f"{SCHEDULED}.worker.{worker_id}"

    def exchange(self, logical: str) -> str:
        """The outbox's logical exchange name ('executions', 'events', 'dlx') -> real name."""
        return self.dlx if logical == "dlx" else f"{self.prefix}.{logical}"


class InvalidMessageError(ValueError):
    """A body that is not a Conveyor envelope: dead-lettered as rejected, never retried."""


@dataclass(frozen=True, slots=True)
class Envelope:
    message_id: str
    message_type: str
    payload: dict[str, Any]

    def ids(self, key: str) -> list[int]:
        values = self.payload.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise InvalidMessageError(f"{self.message_type}: {key} must be a list of integers")
        return values


def encode(message_id: str, message_type: str, payload: dict[str, Any], created: datetime) -> bytes:
    body = {"message_id": message_id, "message_type": message_type, "created": created.isoformat(), "payload": payload}
    return json.dumps(body, separators=(",", ":")).encode()


def strict_json(body: bytes) -> Any:
    """JSON as RFC 8259 and PostgreSQL's jsonb take it: no NaN or Infinity."""
    return jsontext.loads(body)


def decode(body: bytes) -> Envelope:
    try:
        data = strict_json(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidMessageError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidMessageError("body is not a JSON object")
    mtype, payload = data.get("message_type"), data.get("payload")
    if mtype not in KNOWN_TYPES:
        raise InvalidMessageError(f"unknown message_type {mtype!r}")
    if not isinstance(payload, dict):
        raise InvalidMessageError("payload is not a JSON object")
    return Envelope(str(data.get("message_id", "")), mtype, payload)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What an ``execution.scheduled`` message names: the fencing token plus the
    dispatch time, which tells a dispatch apart from a later one with the same attempt."""

    execution_id: int
    attempt: int
    worker_id: int
    scheduled: str

    @classmethod
    def of(cls, envelope: Envelope) -> Dispatch:
        p = envelope.payload
        try:
            values = (p["execution_id"], p["attempt"], p["worker_id"])
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                raise TypeError
            scheduled = p["scheduled"]
            if not isinstance(scheduled, str):
                raise TypeError
            datetime.fromisoformat(scheduled)
        except (KeyError, TypeError, ValueError):
            raise InvalidMessageError(
                "execution.scheduled needs integer execution_id, attempt, worker_id and an ISO scheduled time"
            ) from None
        return cls(values[0], values[1], values[2], scheduled)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered message as recorded in the ``dead_letter`` table."""

    dedupe_key: str
    message_id: str | None
    transport: str
    queue: str
    routing_key: str
    reason: str
    body: bytes
    exchange: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    delivery_count: int = 0

    def envelope(self) -> Envelope:
        return decode(self.body)

    def payload(self) -> dict[str, Any]:
        """The body as stored: its JSON object, else ``{"raw": text}``. PostgreSQL text
        and jsonb cannot hold NUL, so a body with one is kept as escaped text."""
        raw = {"raw": pg_text(self.body.decode("utf-8", "replace")[:65536])}
        try:
            data = strict_json(self.body)
        except ValueError:  # not JSON, or JSON that jsonb cannot hold (NaN, Infinity)
            return raw
        if not isinstance(data, dict) or "\\u0000" in json.dumps(data):
            return raw
        return data

    def as_poison(self, error: str) -> DeadLetter:
        return replace(self, reason="poison", error=error, dedupe_key=f"{self.dedupe_key}:poison")


def pg_text(text: str) -> str:
    """``text`` without NUL characters, which PostgreSQL refuses: written as ``\\x00``."""
    return text.replace("\x00", "\\x00")


def body_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()[:32]


def broker_reason(x_death: list[dict[str, Any]] | None, own_reason: str | None) -> tuple[str, str | None, int]:
    """(reason, queue, deaths) from our own header or RabbitMQ's newest ``x-death`` entry."""
    if own_reason in REASONS:
        return own_reason, None, 1
    if x_death:
        newest = x_death[0]
        deaths = sum(int(d.get("count", 1)) for d in x_death)
        return _BROKER_REASONS.get(str(newest.get("reason")), "rejected"), str(newest.get("queue") or ""), deaths
    return "rejected", None, 1
