"""The outbox relay: publishes committed ``outbox`` rows to RabbitMQ, then deletes them.

One transaction per batch: the rows are locked (``SKIP LOCKED``, so replicas share the
work), published with publisher confirms, and deleted in the same transaction once
the broker confirmed them. A relay that dies between the confirm and the commit
leaves its rows to the next relay, which publishes them again: a duplicate, which every
handler tolerates -- never a lost message.

Within a batch, messages go out in outbox order on one channel, so one queue receives
them in the order they were committed (for one relay; replicas relay disjoint batches).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aio_pika
import structlog

from conveyor.config import Settings
from conveyor.ops import failpoints
from conveyor.ops.metrics import OUTBOX_DEPTH, OUTBOX_PUBLISHED, transport_error
from conveyor.store.db import SESSION_ENDED, Pool, Row
from conveyor.store.queries import Q
from conveyor.transport import messages as m
from conveyor.transport.base import Doorbell

if TYPE_CHECKING:
    from conveyor.transport.rabbitmq import RabbitMQTransport

log = structlog.get_logger(__name__)


class OutboxRelay:
    def __init__(self, pool: Pool, transport: RabbitMQTransport, settings: Settings) -> None:
        self._pool = pool
        self._transport = transport
        self._batch = settings.message_queue.rabbitmq.relay_batch
        self._poll = settings.executor.poll_interval
        self._reconcile_after = settings.message_queue.reconcile_after

    async def run(self, bell: Doorbell) -> None:
        while True:
            try:
                published = await self.relay_once()
            except SESSION_ENDED as exc:
                # Besides an outage: the server ends an executor's session that sits in a
                # transaction longer than executor_liveness.hold_timeout, and a batch waits in
                # its transaction for the broker's confirms (a broker restarting). Its rows are
                # published again by the next batch: a duplicate, never a loss. Uncaught, it
                # ended the executor (found by the chaos run).
                log.warning("outbox relay lost its database session; retrying", error=str(exc).strip())
                await asyncio.sleep(1.0)
                continue
            if published < self._batch:
                await bell.wait(self._poll)

    async def relay_once(self) -> int:
        """Publish one batch; return how many were published. A broker error is raised
        (after committing what was confirmed) so the session reconnects."""
        failure: BaseException | None = None
        async with self._pool.connection() as conn, conn.transaction():
            # Losing this commit in a crash only means publishing the rows again.
            await conn.execute(Q["relaxed_commit"])
            rows = await (await conn.execute(Q["outbox_claim"], {"limit": self._batch})).fetchall()
            if not rows:
                return 0
            if any(_worker_of(r) is not None for r in rows):
                failpoints.reach("relay.before_dispatch_publish")
            channel = self._transport.publish_channel
            names = self._transport.names
            exchanges = {
                logical: await channel.get_exchange(names.exchange(logical), ensure=False)
                for logical in {r["exchange"] for r in rows}
            }
            for wid in sorted({w for r in rows if (w := _worker_of(r)) is not None}):
                await self._transport.declare_worker_queue(wid, owner=False)
            results = await asyncio.gather(
                *(exchanges[r["exchange"]].publish(_message(r), routing_key=r["routing_key"]) for r in rows),
                return_exceptions=True,
            )
            done = [r["id"] for r, res in zip(rows, results, strict=True) if not isinstance(res, BaseException)]
            failure = next((res for res in results if isinstance(res, BaseException)), None)
            if done:
                await conn.execute(Q["outbox_delete"], {"ids": done})
        OUTBOX_PUBLISHED.inc(len(done))
        if failure is not None:
            transport_error("rabbitmq", "publish", len(rows) - len(done))
            raise ConnectionError(f"publish not confirmed: {failure!r}")
        return len(done)

    async def reconcile(self) -> dict[str, int]:
        """Publish again for executions sitting in requested or scheduled past the bound
        with no message pending: whatever happened to their message (a queue deleted by
        hand, a broker that lost it), they are not left waiting for it."""
        params = {"after": self._reconcile_after}
        async with self._pool.connection() as conn, conn.transaction():
            requested = await (await conn.execute(Q["reconcile_requested"], params)).fetchone()
            scheduled = await (await conn.execute(Q["reconcile_scheduled"], params)).fetchall()
            depth = await (await conn.execute(Q["outbox_depth"])).fetchone()
        OUTBOX_DEPTH.set(depth["depth"] if depth else 0)
        result = {"requested": requested["count"] if requested else 0, "scheduled": len(scheduled)}
        if scheduled:
            self._transport.forget_declared()  # in case their queue was deleted under us
        if any(result.values()):
            log.info("reconciler published messages again", **result)
        return result


def _worker_of(row: Row) -> int | None:
    """The worker a dispatch row is for, from its routing key (a malformed row is still
    published: the worker's consumer dead-letters it, rather than the relay stalling)."""
    prefix = m.Names.worker_key(0)[:-1]
    key = str(row["routing_key"])
    return int(key[len(prefix) :]) if key.startswith(prefix) and key[len(prefix) :].isdigit() else None


def _message(row: Row) -> aio_pika.Message:
    return aio_pika.Message(
        m.encode(row["message_id"], row["message_type"], row["payload"], row["created"]),
        message_id=row["message_id"],
        type=row["message_type"],
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        timestamp=row["created"],
        app_id="conveyor",
    )
