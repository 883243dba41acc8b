"""The process's pool (store/db.make_pool) through an outage longer than psycopg_pool's
own reconnection attempt: a pass already waiting for a connection gets one within about
``database.reconnect_interval`` of the database answering again, with no new request to
wake the pool (issue 25: it gave up after 5 s and waited for one, while every loop sat in
its 30 s wait). The outage is a forwarder in front of the shared server that refuses
every new connection; the server itself is never touched."""

from __future__ import annotations

import asyncio
import time

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from acceptance.netns import Forwarder
from conveyor.store.db import make_pool

OUTAGE = 7.0  # longer than psycopg_pool's attempt gave up after (5 s)


async def test_a_waiting_pass_gets_a_connection_soon_after_an_outage_longer_than_one_attempt(db_url: str) -> None:
    server = conninfo_to_dict(db_url)
    with Forwarder("127.0.0.1", (str(server.get("host", "127.0.0.1")), int(server.get("port", 5432)))) as forwarder:
        forwarder.closing.set()  # the database is away: every connection is closed at once
        via = make_conninfo(db_url, host=forwarder.host, port=str(forwarder.port))
        pool = make_pool(via, "conveyor", "test-pool-reconnect", 4)
        await pool.open(wait=False)
        try:

            async def one_query() -> float:
                async with pool.connection(timeout=60) as conn:
                    await conn.execute("SELECT 1")
                return time.monotonic()

            waiting = asyncio.create_task(one_query())
            await asyncio.sleep(OUTAGE)  # the outage itself, not a wait for a result
            assert not waiting.done()
            forwarder.closing.clear()
            back = time.monotonic()
            answered = await asyncio.wait_for(waiting, timeout=30)
        finally:
            await pool.close()
    took = answered - back
    print(f"\nconnection {took:.2f}s after the database answered again (outage {OUTAGE:g}s)")
    assert took < 2.0, took
