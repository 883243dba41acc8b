"""Duplicate messages. Every message is only a doorbell (docs/architecture.md, "The
doorbell principle"), so copies must change nothing; these threads make plenty.

- PostgreSQL (both transports: executors LISTEN on either): copies of the NOTIFYs the
  product sends -- ``<schema>.requested``, ``.capacity``, ``.completed`` with recent ids,
  ``.worker.<id>`` for every worker, ``.workflow``; and duplicate completions: the
  ``child_ended`` events of recently ended workflow children inserted again.
- RabbitMQ: a tap queue bound with ``#`` to ``<prefix>.executions`` receives a copy of
  every message the relays publish (``execution.scheduled``/``requested``/``completed``,
  ``worker.capacity``); raw copies of recent ones are published again, byte for byte with
  their properties, and some are written back into the ``outbox`` (same ``message_id``)
  for a relay to publish a second time. A few ``execution.scheduled`` copies are sent to
  another worker's routing key: refused by that worker, they become ``rejected`` dead
  letters, which the handler must resolve.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import random
import threading
from collections import Counter
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.transport.messages import SCHEDULED, Names

from .faults import connect

SCHEMA = "conveyor"


class NotifyDuplicator(threading.Thread):
    def __init__(self, url: str, every: float = 0.2) -> None:
        super().__init__(name="chaos-notify-dupes", daemon=True)
        self.url = url
        self.every = every
        self.stop = threading.Event()
        self.sent = 0
        self.failed = 0
        self.replayed = 0

    def run(self) -> None:
        conn: psycopg.Connection[dict[str, Any]] | None = None
        while not self.stop.wait(self.every):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.url)
                row = conn.execute(
                    "SELECT (SELECT count(*) FROM worker) AS workers, "
                    "       (SELECT string_agg(id::text, ',') FROM (SELECT id FROM execution "
                    "        ORDER BY updated DESC LIMIT 5) r) AS recent, "
                    "       pg_notify(%(s)s || '.requested', ''), pg_notify(%(s)s || '.capacity', ''), "
                    "       (SELECT count(pg_notify(%(s)s || '.worker.' || id, '')) FROM worker) AS n",
                    {"s": SCHEMA},
                ).fetchone()
                assert row is not None
                conn.execute("SELECT pg_notify(%s, %s)", (f"{SCHEMA}.completed", row["recent"] or ""))
                conn.execute("SELECT pg_notify(%s, '')", (f"{SCHEMA}.workflow",))
                self.sent += 4 + int(row["n"])
                # Duplicate completions: the end of recently ended workflow children told
                # again (their first event is applied, or still pending: then the unique
                # index keeps one), for the advancement to apply once all the same.
                self.replayed += conn.execute(REPLAY).rowcount
            except psycopg.Error:
                self.failed += 1
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


REPLAY = """
INSERT INTO workflow_event (workflow_execution, kind, execution)
SELECT w.id, 'child_ended', c.id
FROM (SELECT id, parent FROM execution WHERE parent IS NOT NULL AND ended IS NOT NULL
      ORDER BY ended DESC LIMIT 5) c
JOIN workflow_execution w ON w.execution = c.parent
ON CONFLICT DO NOTHING
"""


class BrokerDuplicator(threading.Thread):
    def __init__(self, amqp_url: str, db_url: str, prefix: str, seed: int, every: float = 0.2) -> None:
        super().__init__(name="chaos-broker-dupes", daemon=True)
        self.amqp_url = amqp_url
        self.db_url = db_url
        self.names = Names(prefix, f"{prefix}.dlx")
        self.tap = f"{prefix}.chaos.tap"
        self.rng = random.Random(seed)
        self.every = every
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.recent: collections.deque[tuple[str, bytes, dict[str, Any]]] = collections.deque(maxlen=500)

    def run(self) -> None:
        # The broker restarting is expected here: its client's tracebacks are not news.
        for name in ("aiormq", "aio_pika"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        asyncio.run(self._main())

    async def _main(self) -> None:
        import aio_pika

        while not self.stop.is_set():
            try:
                connection = await aio_pika.connect(self.amqp_url, timeout=5)
                async with connection:
                    channel = await connection.channel(publisher_confirms=True)
                    exchange = await channel.get_exchange(self.names.executions, ensure=True)
                    tap = await channel.declare_queue(
                        self.tap, durable=True, arguments={"x-max-length": 1000, "x-overflow": "drop-head"}
                    )
                    await tap.bind(exchange, "#")
                    while not self.stop.is_set():
                        await self._tick(tap, exchange)
                        await asyncio.sleep(self.every)
            except Exception:  # the broker restarting, mostly: try again
                self.counts["broker errors"] += 1
                await asyncio.sleep(1.0)
            finally:
                # A connection that failed half-way closes itself from __del__ with a task on
                # this loop: collect it now and let that task run before the loop ends.
                gc.collect()
                await asyncio.sleep(0.05)

    async def _tick(self, tap: Any, exchange: Any) -> None:
        import aio_pika

        for _ in range(200):
            message = await tap.get(no_ack=True, fail=False)
            if message is None:
                break
            props = {"message_id": message.message_id, "type": message.type, "content_type": message.content_type}
            self.recent.append((message.routing_key or "", message.body, props))
        if not self.recent:
            return
        for _ in range(3):
            key, body, props = self.rng.choice(self.recent)
            copy = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, app_id="conveyor", **props)
            await exchange.publish(copy, routing_key=key)
            self.counts[f"copies of {props['type']}"] += 1
        scheduled = [m for m in self.recent if m[2]["type"] == SCHEDULED]
        if scheduled and self.rng.random() < 0.1:
            key, body, props = self.rng.choice(scheduled)
            worker = json.loads(body)["payload"]["worker_id"]
            others = sorted({json.loads(b)["payload"]["worker_id"] for _, b, _ in scheduled} - {worker})
            if others:
                copy = aio_pika.Message(
                    body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, app_id="conveyor", **props
                )
                await exchange.publish(copy, routing_key=Names.worker_key(self.rng.choice(others)))
                self.counts["misrouted execution.scheduled copies"] += 1
        if self.rng.random() < 0.2:
            await asyncio.to_thread(self._outbox_copy, self.rng.choice(self.recent))

    def _outbox_copy(self, message: tuple[str, bytes, dict[str, Any]]) -> None:
        key, body, props = message
        envelope = json.loads(body)
        payload = envelope["payload"]
        execution = payload.get("execution_id") if props["type"] == SCHEDULED else None
        try:
            with connect(self.db_url) as conn:
                conn.execute(
                    "INSERT INTO outbox (message_id, exchange, routing_key, message_type, payload, execution) "
                    "VALUES (%s, 'executions', %s, %s, %s, %s)",
                    (props["message_id"], key, props["type"], Jsonb(payload), execution),
                )
            self.counts["outbox copies"] += 1
        except psycopg.Error:
            self.counts["outbox copy errors"] += 1

    @property
    def sent(self) -> int:
        return sum(n for what, n in self.counts.items() if "error" not in what)


def delete_tap(amqp_url: str, prefix: str) -> None:
    import aio_pika

    async def clean() -> None:
        connection = await aio_pika.connect(amqp_url, timeout=5)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(f"{prefix}.chaos.tap")

    asyncio.run(clean())
