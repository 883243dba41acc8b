"""Outbox relay benchmark (not a test): how fast the RabbitMQ transport's relay empties
the outbox, against what the broker takes in the same run.

    python bench/relay.py [--n 20000]

Writes N ``execution.scheduled`` outbox rows for one worker (as ``wake('dispatched')``
writes them) in one commit, and times a RabbitMQ transport's own relay (woken by the
outbox NOTIFY: publish with confirms, delete in the same transaction) until the outbox
is empty. Reference: a raw aio-pika publish of N persistent messages to a quorum queue,
``relay_batch`` at a time, each batch awaiting its confirms. Prints both rates, the
settings and the load average. Uses a fresh database and its own broker prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time

import aio_pika
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.service.app import prepare_database
from conveyor.transport.rabbitmq import RabbitMQTransport


async def run(server: str, amqp: str, n: int) -> None:
    name, prefix = "conveyor_bench_relay", f"relaybench{os.getpid()}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(server, dbname=name)
    prepare_database(url, "conveyor")
    os.environ |= {"CONVEYOR__TRANSPORT": "rabbitmq", "CONVEYOR__MESSAGE_QUEUE__URL": amqp,
                   "CONVEYOR__MESSAGE_QUEUE__PREFIX": prefix, "DATABASE_URL": url}  # fmt: skip
    settings = Settings()
    batch = settings.message_queue.rabbitmq.relay_batch
    kwargs = {"autocommit": True, "options": "-c search_path=conveyor", "row_factory": dict_row}
    async with AsyncConnectionPool(url, kwargs=kwargs, open=False) as pool:
        await pool.open()
        transport = RabbitMQTransport(settings, url, pool, relay=True, application_name="relay-bench")
        ready = asyncio.Event()
        task = asyncio.create_task(transport.run(ready))
        await ready.wait()
        while not transport.connected:  # noqa: ASYNC110 - a property, no event to wait on
            await asyncio.sleep(0.05)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(
                "INSERT INTO conveyor.outbox (exchange, routing_key, message_type, payload)"
                " SELECT 'executions', 'execution.scheduled.worker.1', 'execution.scheduled',"
                " jsonb_build_object('execution_id', g, 'attempt', 1, 'worker_id', 1, 'scheduled', now())"
                " FROM generate_series(1, %s) g",
                (n,),
            )
            t0 = time.perf_counter()
            # polled: the relay's deletes are the only sign it is done
            while (row := c.execute("SELECT count(*) FROM conveyor.outbox").fetchone()) and row[0] > 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            relay_s = time.perf_counter() - t0
        conn = await aio_pika.connect(amqp)
        ch = await conn.channel(publisher_confirms=True)
        queue = await ch.declare_queue(f"{prefix}.reference", durable=True, arguments={"x-queue-type": "quorum"})
        body = json.dumps({"execution_id": 1, "attempt": 1, "worker_id": 1, "scheduled": "2026-01-01T00:00:00+00:00"})
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            await asyncio.gather(
                *(
                    ch.default_exchange.publish(
                        aio_pika.Message(body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue.name,
                    )
                    for _ in range(min(batch, n - start))
                )
            )
        reference_s = time.perf_counter() - t0
        cleanup = await conn.channel()
        names = transport.names
        for q in (queue.name, names.worker_queue(1), names.executor_queue, names.dlq):
            with contextlib.suppress(Exception):
                await cleanup.queue_delete(q)
        for ex in (names.executions, names.events, names.dlx):
            with contextlib.suppress(Exception):
                await cleanup.exchange_delete(ex)
        await conn.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    print(f"relay: {n} outbox rows in {relay_s:.2f} s = {n / relay_s:.0f} messages/s (relay_batch={batch})")
    print(f"reference: raw publish with confirms to a quorum queue, {batch} at a time: {n / reference_s:.0f} msg/s")
    print(f"settings: n={n} cpus={os.cpu_count()} load average={os.getloadavg()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    ap.add_argument("--n", type=int, default=20_000)
    args = ap.parse_args()
    asyncio.run(run(args.url, args.amqp_url, args.n))


if __name__ == "__main__":
    main()
