"""Core benchmark (not a test): end-to-end throughput and request-to-start latency.

    python bench/core.py [--url postgresql://postgres@127.0.0.1/postgres] [--n 20000] [--rate 50 --seconds 20]

Starts one `conveyor executor` and one `conveyor worker` as real processes against a
fresh database on an already-running PostgreSQL, then:
  1. throughput: enqueue N core.noop executions in one batch (one transaction), time
     from that commit until the last one is terminal (database clock);
  2. latency: request core.noop one at a time at a steady rate (each its own commit) and
     report started - created (both database clock) at p50/p95/p99.
Prints the figures and every setting they came from.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

from conveyor.app import prepare_database
from conveyor.sdk import request_executions

SCHEMA = "conveyor"
TERMINAL = ("completed", "failed", "timeout", "cancelled", "abandoned")


def fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    prepare_database(url, SCHEMA)
    return url


def start(role: list[str], env: dict[str, str], logdir: Path) -> subprocess.Popen[bytes]:
    log = open(logdir / f"{role[0]}.log", "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen([sys.executable, "-m", "conveyor", *role], env=env, stdout=log, stderr=log)


def wait_for(conn: psycopg.Connection[tuple[object, ...]], query: str, done: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(query).fetchone()
        if row and row[0] == done:
            return
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for: {query}")


def throughput(url: str, n: int, batch: int) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {SCHEMA}")
        conn.execute("TRUNCATE execution CASCADE")
        with conn.transaction():
            for start_at in range(0, n, batch):
                count = min(batch, n - start_at)
                request_executions(conn, [("core.noop", {})] * count)
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row
        t0 = row[0]
        wait_for(conn, f"SELECT count(*) FROM execution WHERE status IN {TERMINAL}", n, timeout=600)
        row = conn.execute(
            "SELECT extract(epoch FROM max(ended) - %s), count(*) FILTER (WHERE status = 'completed') FROM execution",
            (t0,),
        ).fetchone()
        assert row
        elapsed, completed = float(row[0]), int(row[1])
    if completed != n:
        raise SystemExit(f"only {completed} of {n} completed")
    return n / elapsed


def latency(url: str, rate: float, seconds: float) -> list[float]:
    total = int(rate * seconds)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {SCHEMA}")
        conn.execute("TRUNCATE execution CASCADE")
        begin = time.monotonic()
        for i in range(total):
            delay = begin + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            conn.execute("SELECT request_execution('core.noop', '{}')")
        wait_for(conn, f"SELECT count(*) FROM execution WHERE status IN {TERMINAL}", total, timeout=120)
        rows = conn.execute(
            "SELECT extract(epoch FROM started - created) * 1000 FROM execution WHERE started IS NOT NULL"
        ).fetchall()
    return sorted(float(r[0]) for r in rows)


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def run_once(args: argparse.Namespace, transport: str) -> tuple[float, list[float]]:
    """One executor + one worker on ``transport``: (throughput, latencies)."""
    url = fresh_database(args.url, "conveyor_bench")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CONVEYOR__TRANSPORT": transport,
        "CONVEYOR__EXECUTOR__BATCH_SIZE": str(args.batch_size),
        "CONVEYOR__WORKER__MAX_CONCURRENT_TASKS": str(args.concurrency),
        "CONVEYOR__WORKER__NAME": "bench-worker",
        "CONVEYOR__LOG__LEVEL": "warning",
    }
    prefix = f"bench{os.getpid()}"
    if transport == "rabbitmq":
        env |= {"CONVEYOR__MESSAGE_QUEUE__URL": args.amqp_url, "CONVEYOR__MESSAGE_QUEUE__PREFIX": prefix}
    logdir = Path(tempfile.mkdtemp(prefix=f"conveyor-bench-{transport}-"))
    procs = [start(["executor"], env, logdir), start(["worker"], env, logdir)]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(conn, f"SELECT count(*) FROM {SCHEMA}.worker WHERE status = 'active'", 1, timeout=30)
        throughput(url, 500, args.enqueue_batch)  # warm-up
        tput = throughput(url, args.n, args.enqueue_batch)
        lat = latency(url, args.rate, args.seconds)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        if transport == "rabbitmq":
            delete_broker_objects(args.amqp_url, prefix)
    print(f"  {transport} logs: {logdir}", file=sys.stderr)
    return tput, lat


def delete_broker_objects(amqp_url: str, prefix: str) -> None:
    import asyncio

    import aio_pika

    async def clean() -> None:
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            for queue in (f"{prefix}.executor.requests", f"{prefix}.dlx.queue", f"{prefix}.worker.1.executions"):
                await channel.queue_delete(queue)
            for exchange in (f"{prefix}.executions", f"{prefix}.events", f"{prefix}.dlx"):
                await channel.exchange_delete(exchange)

    asyncio.run(clean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--transport", choices=["postgres", "rabbitmq", "both"], default="both")
    parser.add_argument("--n", type=int, default=20_000, help="executions in the throughput run")
    parser.add_argument("--enqueue-batch", type=int, default=5_000, help="rows per enqueue statement")
    parser.add_argument("--batch-size", type=int, default=500, help="executor.batch_size")
    parser.add_argument("--concurrency", type=int, default=500, help="worker.max_concurrent_tasks")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s in the latency run")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the latency run")
    args = parser.parse_args()

    with psycopg.connect(args.url) as conn:
        settings = {
            name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "shared_buffers")
        }
    transports = ["postgres", "rabbitmq"] if args.transport == "both" else [args.transport]
    results = {t: run_once(args, t) for t in transports}

    print("Conveyor core benchmark")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("  postgres: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    if "rabbitmq" in results:
        print(f"  rabbitmq: {args.amqp_url.split('@')[-1]}, quorum queues, publisher confirms, outbox relay")
    print(
        f"  processes: 1 executor + 1 worker, executor.batch_size={args.batch_size}, "
        f"worker.max_concurrent_tasks={args.concurrency}"
    )
    print(
        f"  throughput: {args.n} core.noop enqueued in batches of {args.enqueue_batch} "
        "(enqueue commit -> last ended, database clock)"
    )
    print(f"  latency: core.noop at {args.rate:g}/s for {args.seconds:g}s, requested -> started (database clock)")
    print(f"{'transport':<10} {'executions/s':>13} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for transport, (tput, lat) in results.items():
        print(
            f"{transport:<10} {tput:>13,.0f} {pct(lat, 50):>8.2f} {pct(lat, 95):>8.2f} {pct(lat, 99):>8.2f} "
            f"{lat[-1]:>8.2f}"
        )


if __name__ == "__main__":
    main()
