"""The PostgreSQL transport: the database NOTIFYs in the state-changing transaction
(``wake()``), and each process LISTENs on one dedicated connection. Polling by the
consumers covers anything missed while the listener reconnects."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import psycopg
import structlog

from conveyor.ops.metrics import transport_error
from conveyor.store.db import RECONNECT_INTERVAL, AsyncConn, channel, conninfo_kwargs, listen_statement
from conveyor.transport.base import Doorbell, Topic, Transport

log = structlog.get_logger(__name__)


class PostgresTransport(Transport):
    kind = "postgres"

    def __init__(
        self,
        url: str,
        schema: str,
        application_name: str = "conveyor-listener",
        *,
        reconnect_interval: float = RECONNECT_INTERVAL,
    ) -> None:
        self._url = url
        # The back-off's ceiling (database.reconnect_interval): consumers poll meanwhile, but
        # a listener that reconnected only 5 s after the server was back left every doorbell
        # silent -- each dispatch waited for a poll -- that long.
        self._max_delay = reconnect_interval
        self._schema = schema
        self._application_name = application_name
        self._bells: dict[str, list[Doorbell]] = defaultdict(list)

    def channel(self, topic: Topic, worker_id: int | None = None) -> str:
        if topic is Topic.WORKER:
            if worker_id is None:
                raise ValueError("the worker topic needs a worker id")
            return channel(self._schema, topic, worker_id)
        return channel(self._schema, topic)

    @property
    def has_subscriptions(self) -> bool:
        return bool(self._bells)

    def subscribe(self, topic: Topic, worker_id: int | None = None, bell: Doorbell | None = None) -> Doorbell:
        bell = bell or Doorbell()
        self._bells[self.channel(topic, worker_id)].append(bell)
        return bell

    def _ring_all(self) -> None:
        for bells in self._bells.values():
            for bell in bells:
                bell.ring()

    async def run(self, ready: asyncio.Event) -> None:
        delay = min(0.1, self._max_delay)
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, **conninfo_kwargs(self._schema, self._application_name)
                )
            except psycopg.OperationalError as exc:
                log.warning("listener cannot connect; retrying", error=str(exc).strip(), retry_in=delay)
                transport_error("postgres", "connect")
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_delay)
                continue
            # Closed in ``finally``, not by ``async with conn``: that rolls back first when
            # the block raises, and a cancellation landing in that rollback (a shutdown)
            # skipped the close -- the session lived on until the garbage collector found
            # it. ``close()`` never waits, so nothing can interrupt it.
            try:
                await self._listen(conn, ready)
                continue  # the server ended the notifications stream: listen again at once
            except psycopg.OperationalError as exc:
                if self._connected:  # it had listened: a new outage, the back-off starts over
                    delay, self._connected = min(0.1, self._max_delay), False
                log.warning("listener connection lost; reconnecting", error=str(exc).strip())
                transport_error("postgres", "consume")
            finally:
                await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_delay)

    async def _listen(self, conn: AsyncConn, ready: asyncio.Event) -> None:
        for name in self._bells:
            await conn.execute(listen_statement(name))
        self._connected = True
        ready.set()
        # Anything published while we were not listening is found by the consumers' next
        # read: wake them all now.
        self._ring_all()
        async for note in conn.notifies():
            for bell in self._bells.get(note.channel, ()):
                bell.ring(note.payload)
