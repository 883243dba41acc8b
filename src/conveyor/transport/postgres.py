"""The PostgreSQL transport: NOTIFY in the state-changing transaction, LISTEN on one
dedicated connection per process. Polling by the consumers covers anything missed
while the listener reconnects."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import psycopg
import structlog

from conveyor.store.db import conninfo_kwargs, listen_statement
from conveyor.transport.base import Doorbell, Topic, Transport

log = structlog.get_logger(__name__)

# NOTIFY payloads are capped at 8000 bytes; longer id lists are sent without a
# payload and the waiters re-read their rows.
_PAYLOAD_LIMIT = 7900


class PostgresTransport(Transport):
    def __init__(self, url: str, schema: str, application_name: str = "conveyor-listener") -> None:
        self._url = url
        self._schema = schema
        self._application_name = application_name
        self._bells: dict[str, list[Doorbell]] = defaultdict(list)

    def channel(self, topic: Topic, worker_id: int | None = None) -> str:
        if topic is Topic.WORKER:
            if worker_id is None:
                raise ValueError("the worker topic needs a worker id")
            return f"{self._schema}.worker.{worker_id}"
        return f"{self._schema}.{topic.value}"

    async def publish(
        self,
        conn: psycopg.AsyncConnection[Any],
        topic: Topic,
        *,
        worker_ids: Iterable[int] = (),
        execution_ids: Iterable[int] = (),
    ) -> None:
        if topic is Topic.WORKER:
            channels = [self.channel(topic, w) for w in sorted(set(worker_ids))]
            if channels:
                await conn.execute("SELECT pg_notify(c, '') FROM unnest(%s::text[]) AS c", (channels,))
            return
        payload = ",".join(str(i) for i in execution_ids)
        if len(payload) > _PAYLOAD_LIMIT:
            payload = ""
        await conn.execute("SELECT pg_notify(%s, %s)", (self.channel(topic), payload))

    def subscribe(self, topic: Topic, worker_id: int | None = None, bell: Doorbell | None = None) -> Doorbell:
        bell = bell or Doorbell()
        self._bells[self.channel(topic, worker_id)].append(bell)
        return bell

    def _ring_all(self) -> None:
        for bells in self._bells.values():
            for bell in bells:
                bell.ring()

    async def run(self, ready: asyncio.Event) -> None:
        delay = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, **conninfo_kwargs(self._schema, self._application_name)
                )
            except psycopg.OperationalError as exc:
                log.warning("listener cannot connect; retrying", error=str(exc).strip(), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                async with conn:
                    for name in self._bells:
                        await conn.execute(listen_statement(name))
                    delay = 0.1
                    self.connected = True
                    ready.set()
                    # Anything published while we were not listening is found by
                    # the consumers' next read: wake them all now.
                    self._ring_all()
                    async for note in conn.notifies():
                        for bell in self._bells.get(note.channel, ()):
                            bell.ring(note.payload)
            except psycopg.OperationalError as exc:
                self.connected = False
                log.warning("listener connection lost; reconnecting", error=str(exc).strip())
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
