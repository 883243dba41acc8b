"""Dead letters coming from RabbitMQ: turning a message into a ``DeadLetter`` record,
and the consumer of the dead-letter queue.

The consumer acknowledges only after the handler committed. During a database outage
it keeps the message and tries again every ``OUTAGE_PAUSE`` until the database is back:
giving it back to the queue would count as a delivery on RabbitMQ 4.0-4.2, whose quorum
queues have a default delivery limit of 20, and the dead-letter queue has no dead-letter
exchange of its own -- an outage of half a minute would drop dead letters. Any other
failure is retried up to ``dead_letter.max_deliveries`` deliveries, then the message is
recorded as poison -- left pending for an operator -- and acknowledged. A malformed
message is recorded as invalid by the handler itself: nothing here can crash-loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

import aio_pika
import psycopg
import structlog
from aio_pika.abc import AbstractIncomingMessage

from conveyor.ops.metrics import transport_error
from conveyor.transport.base import DeadLetterSink
from conveyor.transport.messages import DeadLetter, body_digest, broker_reason, pg_text

log = structlog.get_logger(__name__)

OUTAGE_PAUSE = 1.0


def dead_letter_copy(message: AbstractIncomingMessage, reason: str, error: str, queue: str) -> aio_pika.Message:
    """A copy of ``message`` for the dead-letter exchange, saying why and from where. Used
    when *we* give up on a message (invalid, poison): the broker's own dead-lettering
    cannot carry the error text."""
    headers = dict(message.headers or {})
    headers.update(
        {
            "x-conveyor-reason": reason,
            "x-conveyor-error": error[:2000],
            "x-conveyor-queue": queue,
            "x-conveyor-death-id": str(uuid.uuid4()),
        }
    )
    return aio_pika.Message(
        message.body,
        headers=headers,
        message_id=message.message_id,
        type=message.type,
        content_type=message.content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        timestamp=message.timestamp,
    )


def dead_letter_from_message(message: AbstractIncomingMessage) -> DeadLetter:
    headers = dict(message.headers or {})
    x_death = headers.get("x-death")
    deaths_list = [d for d in x_death if isinstance(d, dict)] if isinstance(x_death, list) else []
    own_reason = headers.get("x-conveyor-reason")
    reason, queue, deaths = broker_reason(deaths_list, own_reason if isinstance(own_reason, str) else None)
    queue = str(headers.get("x-conveyor-queue") or queue or "")
    newest = deaths_list[0] if deaths_list else {}
    keys = newest.get("routing-keys")
    routing_key = str(keys[0]) if isinstance(keys, list) and keys else message.routing_key or ""
    exchange = newest.get("exchange", message.exchange)
    message_id = message.message_id or body_digest(message.body)
    death_id = headers.get("x-conveyor-death-id")
    dedupe_key = pg_text(str(death_id) if death_id else f"{message_id}:{queue}:{reason}:{deaths}")
    message_id = pg_text(message_id)
    error = headers.get("x-conveyor-error")
    count = headers.get("x-delivery-count", 0)
    return DeadLetter(
        dedupe_key=dedupe_key,
        message_id=message_id,
        transport="rabbitmq",
        queue=pg_text(queue) or "(unknown)",
        routing_key=pg_text(routing_key),
        reason=reason,
        body=message.body,
        exchange=pg_text(str(exchange)) if exchange is not None else None,
        headers=jsonable(headers),
        error=pg_text(str(error)) if error else None,
        delivery_count=int(count) if isinstance(count, int) else 0,
    )


def jsonable(value: Any) -> Any:
    """AMQP header values (tables, timestamps, bytes, decimals) as JSON values."""
    if isinstance(value, dict):
        return {pg_text(str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return pg_text(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, str):
        return pg_text(value)
    if isinstance(value, Decimal):
        return float(value)
    if value is None or isinstance(value, int | float | bool):
        return value
    return pg_text(str(value))


class DeadLetterConsumer:
    def __init__(self, sink: DeadLetterSink, max_deliveries: int) -> None:
        self._sink = sink
        self._max = max_deliveries

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        dead_letter = dead_letter_from_message(message)
        try:
            await self._until_database_answers(lambda: self._sink.handle(dead_letter))
        except Exception as exc:  # a handler bug must not crash-loop the consumer
            error = f"{type(exc).__name__}: {exc}"
            if dead_letter.delivery_count + 1 < self._max:
                log.warning(
                    "dead letter handling failed; it will be retried",
                    error=error,
                    message_id=dead_letter.message_id,
                    delivery=dead_letter.delivery_count + 1,
                )
                transport_error("rabbitmq", "consume")
                # reject, not nack: a failure, counted in x-delivery-count on every broker
                # version (from RabbitMQ 4.3 a requeueing nack no longer counts).
                await message.reject(requeue=True)
                return
            try:
                await self._until_database_answers(lambda: self._sink.record_unresolved(dead_letter.as_poison(error)))
            except Exception:  # even the record fails: logged with the body, then let go
                log.exception(
                    "poison dead letter could not be recorded; dropped",
                    message_id=dead_letter.message_id,
                    body=dead_letter.body[:2000].decode("utf-8", "replace"),
                    error=error,
                )
                await message.ack()
                return
            log.error(
                "dead letter could not be handled; recorded as poison for an operator",
                error=error,
                message_id=dead_letter.message_id,
                deliveries=dead_letter.delivery_count + 1,
            )
        await message.ack()

    @staticmethod
    async def _until_database_answers(step: Callable[[], Awaitable[object]]) -> None:
        """Run ``step``, again after each database outage, until it gets through (the
        message stays unacknowledged meanwhile; if our broker connection drops, the
        broker gives it to another consumer, and the handling is idempotent)."""
        while True:
            try:
                await step()
                return
            except psycopg.OperationalError as exc:
                log.warning("database unreachable; dead letter kept, handled when it returns", error=str(exc).strip())
                transport_error("rabbitmq", "consume")
                await asyncio.sleep(OUTAGE_PAUSE)
