"""The outbox relay when the server ends its session (issue #25, point 7, follow-up).

An executor's sessions carry ``executor_liveness.hold_timeout`` as
``idle_in_transaction_session_timeout``, and a relay batch waits in its transaction for the
broker's confirms: a broker slow to confirm (restarting, say) gets the session ended by the
server. The relay must retry -- its rows are published again, a duplicate every handler
tolerates -- not end the executor: the chaos run found an executor that died of the
uncaught ``IdleInTransactionSessionTimeout``.

The database is real (its timeout ends the session); the broker is a stand-in whose
confirms take longer than the timeout, which is the one thing this test needs of it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import psycopg

from conveyor.config import Settings
from conveyor.store.db import make_pool
from conveyor.transport import messages as m
from conveyor.transport.base import Doorbell
from conveyor.transport.relay import OutboxRelay
from support.polling import until

HOLD = 0.3  # seconds a session may sit in a transaction (the executor's hold_timeout)


class SlowExchange:
    """Confirms each publish after ``delay`` seconds; counts the attempts."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.attempts = 0

    async def publish(self, message: Any, routing_key: str) -> None:
        self.attempts += 1
        await asyncio.sleep(self.delay)


async def test_a_session_ended_mid_batch_is_retried_not_fatal(conn: psycopg.Connection[Any], db_url: str) -> None:
    exchange = SlowExchange(delay=HOLD * 3)

    async def get_exchange(name: str, ensure: bool = False) -> SlowExchange:
        return exchange

    channel = SimpleNamespace(get_exchange=get_exchange)
    broker: Any = SimpleNamespace(publish_channel=channel, names=m.Names("t", "t.dlx"))
    conn.execute(
        "INSERT INTO outbox (exchange, routing_key, message_type, payload) "
        "VALUES ('events', 'execution.requested', 'ExecutionRequested', '{\"id\": 1}'::jsonb)"
    )
    conn.commit()
    pool = make_pool(db_url, "conveyor", "test-relay", 2, idle_timeout=HOLD, timeout=5)
    await pool.open()
    relay = OutboxRelay(pool, broker, Settings())
    task = asyncio.create_task(relay.run(Doorbell()))
    try:
        # The first batch is ended by the server while it waits for the confirm; the relay
        # tries again (and again: this broker is always too slow) instead of ending.
        await until(lambda: task.done() or exchange.attempts >= 2, timeout=20, what="the relay publishing again")
        assert not task.done(), f"the relay ended: {task.exception()!r}"
        # A broker that confirms in time: the row is published and deleted.
        exchange.delay = 0
        await until(
            lambda: conn.execute("SELECT count(*) AS n FROM outbox").fetchone()["n"] == 0,
            timeout=20,
            what="the outbox relayed",
        )
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()
