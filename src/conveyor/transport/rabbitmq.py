"""The RabbitMQ transport: the seeds' exchanges and queues, fed by a transactional outbox.

Publishing writes ``outbox`` rows in the caller's transaction (plus a NOTIFY that wakes
the relay); the relay in each executor publishes them with publisher confirms and
deletes them (``relay.py``). Consumers ring the same doorbells as the PostgreSQL
transport, so executor and worker code does not know which transport runs.

Topology (``<p>`` = ``message_queue.prefix``, ``<dlx>`` = ``dead_letter.exchange``):

- ``<p>.executions`` topic exchange; ``<p>.events`` topic exchange (for rules, later);
- ``<p>.executor.requests``: quorum queue shared by executor replicas (competing
  consumers), bound to ``execution.requested`` and ``worker.capacity``;
- ``<p>.worker.{id}.executions``: quorum queue per worker, bound to
  ``execution.scheduled.worker.{id}``, with ``x-message-ttl`` and ``x-expires``;
- ``<dlx>``: a *fanout* exchange, so every expired or rejected message reaches
  ``<dlx>.queue`` whatever its routing key (the seeds bound a direct exchange with
  ``#``, which matches nothing, and lost them all);
- ``execution.completed`` goes to an exclusive queue per subscribing process.

Every durable queue dead-letters into ``<dlx>`` and has ``x-delivery-limit``: a message
whose consumers keep dying is dead-lettered instead of looping (set explicitly: RabbitMQ
4.0 gives quorum queues a default of 20). Worker queues dead-letter *at least once*
(``x-dead-letter-strategy``, with the ``x-overflow: reject-publish`` it requires): an
expired dispatch is not lost between its queue and the dead-letter queue when a node fails.

A cluster is given as several URLs (``message_queue.url``, comma-separated): each process
starts at a random node and, at every reconnection, tries the next one first, so the
processes of a fleet spread over the nodes and one whose node died moves to another.
Quorum queues are replicated on the cluster's nodes by RabbitMQ itself. (aio-pika's
``connect_robust`` would reconnect to its one URL only, and restore consumers without
the declarations and the catch-up read a new session does here: hence this loop.)

Requests made in SQL (``request_execution()``) and the SDK's waits keep using NOTIFY,
which needs no broker: executors also listen for ``<schema>.requested``, and completions
are NOTIFYed as well as published.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aiormq.exceptions import AMQPError, ChannelPreconditionFailed

from conveyor.config import Settings
from conveyor.ops.metrics import transport_error
from conveyor.store.db import Pool
from conveyor.transport import messages as m
from conveyor.transport.amqp_in import DeadLetterConsumer, dead_letter_copy
from conveyor.transport.base import DeadLetterSink, Doorbell, Topic, Transport
from conveyor.transport.postgres import PostgresTransport
from conveyor.transport.relay import OutboxRelay

log = structlog.get_logger(__name__)

# What a lost or refused broker connection raises (aio-pika's own list includes
# RuntimeError: a closed channel's "invalid state").
BROKER_ERRORS = (*CONNECTION_EXCEPTIONS, AMQPError, asyncio.TimeoutError)


T = TypeVar("T")


def rotated(items: Sequence[T], start: int) -> list[T]:
    """``items`` from ``start`` (modulo their number) on, wrapping round."""
    if not items:
        return []
    k = start % len(items)
    return [*items[k:], *items[:k]]


def node_of(url: str) -> str:
    """``host:port`` of an AMQP URL, for logs (no credentials)."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname}:{parts.port or (5671 if parts.scheme == 'amqps' else 5672)}"
    except ValueError:
        return "(invalid URL)"


class RabbitMQTransport(Transport):
    kind = "rabbitmq"

    def __init__(self, settings: Settings, db_url: str, pool: Pool, *, relay: bool, application_name: str) -> None:
        self._settings = settings
        self._mq = settings.message_queue
        self.names = m.Names(self._mq.prefix, settings.dead_letter_exchange)
        self._schema = settings.database.schema_name
        self._application_name = application_name
        self._pg = PostgresTransport(
            db_url, self._schema, application_name, reconnect_interval=settings.database.reconnect_interval
        )
        self._bells: dict[str, list[Doorbell]] = defaultdict(list)
        self._workers: set[int] = set()
        self._sink: DeadLetterSink | None = None
        self._relay = OutboxRelay(pool, self, settings) if relay else None
        self._outbox_bell = self._pg.subscribe(Topic.OUTBOX) if relay else None
        self._broker_up = False
        self._connection: AbstractConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._declared: dict[int, float] = {}  # worker queue -> when this session declared it
        # Where the first connection attempt starts in the list of nodes: a random node, so
        # the processes of a fleet spread over the cluster.
        self._next = random.randrange(len(self._mq.urls))

    # -- subscribing -----------------------------------------------------------------

    def subscribe(self, topic: Topic, worker_id: int | None = None, bell: Doorbell | None = None) -> Doorbell:
        bell = bell or Doorbell()
        if topic is Topic.WORKER:
            if worker_id is None:
                raise ValueError("the worker topic needs a worker id")
            self._workers.add(worker_id)
            self._bells[m.Names.worker_key(worker_id)].append(bell)
        elif topic in (Topic.OUTBOX, Topic.WORKFLOW, Topic.EVENT, Topic.SCHEDULE, Topic.INQUIRY, Topic.OUTPUT):
            # Rung by a NOTIFY on both transports: heard through the PostgreSQL listener.
            self._pg.subscribe(topic, bell=bell)
        else:
            self._bells[m.DOORBELL_KEYS[topic]].append(bell)
            if topic is Topic.REQUESTED:
                self._pg.subscribe(Topic.REQUESTED, bell=bell)  # requests made in SQL
        return bell

    async def reconcile(self) -> dict[str, int]:
        return await self._relay.reconcile() if self._relay is not None else {}

    def handle_dead_letters(self, sink: DeadLetterSink) -> None:
        self._sink = sink

    @property
    def connected(self) -> bool:
        return self._broker_up and (self._pg.connected or not self._pg.has_subscriptions)

    async def dlq_depth(self) -> int | None:
        if self._connection is None or not self._broker_up:
            return None
        try:
            async with self._connection.channel() as ch:
                queue = await ch.declare_queue(self.names.dlq, passive=True)
                return queue.declaration_result.message_count
        except BROKER_ERRORS:
            return None

    async def run(self, ready: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            pg_ready = asyncio.Event()
            if self._pg.has_subscriptions:
                tg.create_task(self._pg.run(pg_ready), name="transport-listen")
            else:
                pg_ready.set()
            tg.create_task(self._broker_loop(), name="transport-broker")
            await pg_ready.wait()
            # Services start without waiting for the broker (``connected`` says when it is
            # there): its messages only ring doorbells and every consumer also polls the
            # database, so a worker started during a broker outage heartbeats and takes its
            # work, more slowly, instead of sitting registered and silent until declared dead,
            # and an executor runs its database duties.
            ready.set()

    # -- the broker session ----------------------------------------------------------

    async def _connect(self) -> tuple[AbstractConnection, int]:
        """A connection to the first node that answers, trying them from ``self._next``
        on; the connected node's index. Raises the last error when none answers."""
        urls = self._mq.urls
        error: BaseException | None = None
        for index in rotated(range(len(urls)), self._next):
            try:
                connection = await aio_pika.connect(
                    urls[index],
                    timeout=10,
                    client_properties={"connection_name": self._application_name},
                    heartbeat=self._mq.rabbitmq.heartbeat,
                )
            except BROKER_ERRORS as exc:
                error = exc
                if len(urls) > 1:
                    log.info(
                        "RabbitMQ node unreachable; trying the next",
                        node=node_of(urls[index]),
                        error=str(exc) or type(exc).__name__,
                    )
                continue
            return connection, index
        assert error is not None
        raise error

    async def _broker_loop(self) -> None:
        delay = 0.2
        while True:
            try:
                connection, index = await self._connect()
            except BROKER_ERRORS as exc:
                log.warning("cannot reach RabbitMQ; retrying", error=str(exc) or type(exc).__name__, retry_in=delay)
                transport_error("rabbitmq", "connect")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            # The next connection starts with the next node: when this one is lost, its
            # node may be what failed, and a restarted fleet still spreads over the cluster.
            self._next = index + 1
            closed = asyncio.Event()
            connection.close_callbacks.add(lambda *_, closed=closed: closed.set())
            try:
                async with connection:
                    self._connection = connection
                    await self._session(connection, closed, node_of(self._mq.urls[index]))
            except BROKER_ERRORS as exc:
                log.warning("RabbitMQ connection lost; reconnecting", error=str(exc) or type(exc).__name__)
                transport_error("rabbitmq", "consume")
            finally:
                if self._broker_up:  # a session that got going: start the backoff over
                    delay = 0.2
                self._broker_up = False
                self._connection = self._publish_channel = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _session(self, connection: AbstractConnection, closed: asyncio.Event, node: str) -> None:
        publish = await connection.channel(publisher_confirms=True)
        await self._declare_shared(publish)
        self._publish_channel = publish
        self._declared = {}
        consume = await connection.channel()
        await consume.set_qos(prefetch_count=self._mq.rabbitmq.prefetch)
        executor_keys = [k for k in (m.REQUESTED, m.CAPACITY) if self._bells.get(k)]
        if executor_keys:
            queue = await consume.get_queue(self.names.executor_queue, ensure=False)
            await queue.consume(partial(self._doorbell, keys=executor_keys, queue=self.names.executor_queue))
        for wid in sorted(self._workers):
            await self.declare_worker_queue(wid, owner=True)
            queue = await consume.get_queue(self.names.worker_queue(wid), ensure=False)
            await queue.consume(partial(self._dispatch, worker_id=wid))
        if self._bells.get(m.COMPLETED):
            own = await consume.declare_queue(exclusive=True, auto_delete=True)
            await own.bind(self.names.executions, m.COMPLETED)
            await own.consume(partial(self._doorbell, keys=[m.COMPLETED], queue=own.name))
        if self._sink is not None and self._settings.dead_letter.enabled:
            dlq = await consume.get_queue(self.names.dlq, ensure=False)
            consumer = DeadLetterConsumer(self._sink, self._settings.dead_letter.max_deliveries)
            await dlq.consume(consumer.on_message)
        self._broker_up = True
        log.info("connected to RabbitMQ", node=node, workers=sorted(self._workers), executor=bool(executor_keys))
        # Anything that happened while we were away is found by the consumers' next read.
        for bells in self._bells.values():
            for bell in bells:
                bell.ring()
        # Until the connection closes or the relay fails (a publish not confirmed): either
        # way the session ends and the loop reconnects.
        waits: list[asyncio.Task[Any]] = [asyncio.create_task(closed.wait(), name="transport-closed")]
        if self._relay is not None and self._outbox_bell is not None:
            waits.append(asyncio.create_task(self._relay.run(self._outbox_bell), name="transport-relay"))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # the relay's error, if it ended with one
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        raise ConnectionError("connection closed by the broker")

    async def _declare_shared(self, ch: AbstractChannel) -> None:
        n, dl = self.names, self._settings.dead_letter
        await ch.declare_exchange(n.executions, aio_pika.ExchangeType.TOPIC, durable=True)
        await ch.declare_exchange(n.events, aio_pika.ExchangeType.TOPIC, durable=True)
        await ch.declare_exchange(n.dlx, aio_pika.ExchangeType.FANOUT, durable=True)
        # The dead-letter queue may hold letters not yet recorded: never deleted here.
        dlq_args = {"x-queue-type": "quorum", "x-message-ttl": dl.ttl_ms}
        await self._declare_queue(n.dlq, dlq_args, [(n.dlx, "")], recreate=False)
        # The requests queue holds only wake-ups: recreated when its arguments changed.
        bindings = [(n.executions, m.REQUESTED), (n.executions, m.CAPACITY)]
        await self._declare_queue(n.executor_queue, self._queue_args(), bindings, recreate=True)

    async def _declare_queue(
        self, name: str, args: dict[str, Any], bindings: list[tuple[str, str]], *, recreate: bool
    ) -> None:
        """Declare a durable queue and its bindings. A queue that exists with other
        arguments (a changed setting) is recreated when ``recreate``, else used as it is
        with a warning -- rather than refusing to start over it."""
        assert self._connection is not None
        ch = await self._connection.channel()
        try:
            try:
                queue = await ch.declare_queue(name, durable=True, arguments=args)
            except ChannelPreconditionFailed as exc:
                ch = await self._connection.channel()
                if recreate:
                    log.warning(
                        "queue had other arguments; recreating it with the configured ones", queue=name, error=str(exc)
                    )
                    await ch.queue_delete(name)
                    queue = await ch.declare_queue(name, durable=True, arguments=args)
                else:
                    log.warning(
                        "queue has other arguments than configured; using it as it is (see the runbook to change them)",
                        queue=name,
                        error=str(exc),
                    )
                    queue = await ch.declare_queue(name, passive=True)
            for exchange, key in bindings:
                await queue.bind(exchange, key)
        finally:
            await ch.close()

    def _queue_args(self, **extra: Any) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": self.names.dlx,
            "x-delivery-limit": self._mq.rabbitmq.delivery_limit,
            **extra,
        }

    def worker_queue_args(self) -> dict[str, Any]:
        cfg = self._mq.rabbitmq
        extra: dict[str, Any] = {"x-message-ttl": cfg.worker_queue_ttl_ms, "x-expires": cfg.worker_queue_expires_ms}
        if cfg.dead_letter_strategy == "at-least-once":
            # An expired dispatch stays in its queue until the dead-letter queue confirmed
            # it (a node failure in between loses nothing). RabbitMQ applies the strategy
            # only with overflow reject-publish (else it falls back to at-most-once);
            # worker queues have no length limit, so no publish is ever rejected for it.
            extra |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        return self._queue_args(**extra)

    async def declare_worker_queue(self, worker_id: int, *, owner: bool) -> None:
        """Declare a worker's queue, as its owner (the worker) or before publishing to it
        (the relay: a dispatch is never unroutable, even to a worker that just
        registered). Its owner recreates it when it exists with other arguments (a
        changed TTL): what it held is still in the database as that worker's scheduled
        executions, which the worker reads on start. Declared again every quarter of
        ``x-expires`` while in use, which keeps a queue that is published to from expiring."""
        now = time.monotonic()
        if now - self._declared.get(worker_id, -math.inf) < self._mq.rabbitmq.worker_queue_expires_ms / 4000:
            return
        name, key = self.names.worker_queue(worker_id), m.Names.worker_key(worker_id)
        await self._declare_queue(name, self.worker_queue_args(), [(self.names.executions, key)], recreate=owner)
        self._declared[worker_id] = now

    def forget_declared(self) -> None:
        """The reconciler calls this so a queue deleted under us is declared again."""
        self._declared = {}

    @property
    def publish_channel(self) -> AbstractChannel:
        if self._publish_channel is None:
            raise ConnectionError("not connected to RabbitMQ")
        return self._publish_channel

    # -- consumers -------------------------------------------------------------------

    async def _doorbell(self, message: AbstractIncomingMessage, keys: list[str], queue: str) -> None:
        try:
            envelope = m.decode(message.body)
            ids = envelope.ids("worker_ids" if envelope.message_type == m.CAPACITY else "execution_ids")
        except m.InvalidMessageError as exc:
            await self._reject(message, str(exc), queue)
            return
        key = envelope.message_type if envelope.message_type in keys else message.routing_key or ""
        for bell in self._bells.get(key, ()):
            bell.ring(",".join(map(str, ids)))
        await message.ack()

    async def _dispatch(self, message: AbstractIncomingMessage, worker_id: int) -> None:
        try:
            envelope = m.decode(message.body)
            if envelope.message_type != m.SCHEDULED:
                raise m.InvalidMessageError(f"a worker queue takes execution.scheduled, not {envelope.message_type}")
            dispatch = m.Dispatch.of(envelope)
            if dispatch.worker_id != worker_id:
                raise m.InvalidMessageError(f"dispatch for worker {dispatch.worker_id} in the queue of {worker_id}")
        except m.InvalidMessageError as exc:
            await self._reject(message, str(exc), self.names.worker_queue(worker_id))
            return
        # The worker claims from its rows; the message only says "look now".
        for bell in self._bells.get(m.Names.worker_key(worker_id), ()):
            bell.ring(str(dispatch.execution_id))
        await message.ack()

    async def _reject(self, message: AbstractIncomingMessage, error: str, queue: str) -> None:
        """An invalid message: to the dead-letter exchange with the reason, then acked.
        If that publish fails the message goes back to its queue, not lost."""
        log.warning("invalid message dead-lettered", queue=queue, error=error)
        try:
            dlx = await self.publish_channel.get_exchange(self.names.dlx, ensure=False)
            copy = dead_letter_copy(message, "rejected", error, queue)
            await dlx.publish(copy, routing_key=message.routing_key or "")
        except BROKER_ERRORS:
            transport_error("rabbitmq", "publish")
            await message.nack(requeue=True)
            return
        await message.ack()
