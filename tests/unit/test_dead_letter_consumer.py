"""The dead-letter queue's consumer during a database outage: it keeps the message and
tries again, rather than giving it back to the queue. A requeue counts as a delivery on
RabbitMQ 4.0-4.2, whose quorum queues dead-letter (or, for the dead-letter queue itself,
drop) a message after 20 by default."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from conveyor.transport import amqp_in
from conveyor.transport.amqp_in import DeadLetterConsumer
from conveyor.transport.messages import DeadLetter


class Message:
    def __init__(self) -> None:
        self.headers: dict[str, Any] = {"x-delivery-count": 0}
        self.body, self.message_id, self.routing_key, self.exchange = b"{}", "m1", "rk", "x"
        self.settled: list[str] = []

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nack(self, requeue: bool = True) -> None:
        self.settled.append(f"nack(requeue={requeue})")

    async def reject(self, requeue: bool = False) -> None:
        self.settled.append(f"reject(requeue={requeue})")


class Sink:
    def __init__(self, outages: int, fail: Exception | None = None) -> None:
        self.outages, self.fail = outages, fail
        self.handled: list[str] = []
        self.poison: list[DeadLetter] = []

    async def handle(self, letter: DeadLetter) -> None:
        if self.outages:
            self.outages -= 1
            raise psycopg.OperationalError("connection refused")
        if self.fail is not None:
            raise self.fail
        self.handled.append(letter.message_id)

    async def record_unresolved(self, letter: DeadLetter) -> None:
        if self.outages:
            self.outages -= 1
            raise psycopg.OperationalError("connection refused")
        self.poison.append(letter)


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amqp_in, "OUTAGE_PAUSE", 0)


async def test_an_outage_keeps_the_letter_and_handles_it_once_the_database_is_back() -> None:
    sink, message = Sink(outages=30), Message()  # longer than RabbitMQ 4's 20 deliveries
    await DeadLetterConsumer(sink, max_deliveries=5).on_message(message)  # type: ignore[arg-type]
    assert sink.handled == ["m1"]
    assert message.settled == ["ack"]  # never given back: no delivery counted


async def test_a_handler_failure_is_still_given_back_then_recorded_as_poison() -> None:
    sink, message = Sink(outages=0, fail=ValueError("bug")), Message()
    consumer = DeadLetterConsumer(sink, max_deliveries=2)
    await consumer.on_message(message)  # type: ignore[arg-type]
    assert message.settled == ["reject(requeue=True)"]
    message.headers["x-delivery-count"] = 1
    sink.outages = 3  # and the poison record waits out an outage too
    await consumer.on_message(message)  # type: ignore[arg-type]
    assert [p.message_id for p in sink.poison] == ["m1"]
    assert message.settled == ["reject(requeue=True)", "ack"]
