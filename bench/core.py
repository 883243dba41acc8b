"""Core benchmark (not a test): end-to-end throughput at several concurrencies, request-to-
start latency, worker memory -- on both transports, next to a reference measured in the
same run.

    python bench/core.py [--quick] [--transport postgres|rabbitmq|both] [--concurrency 2,10,500]

For each transport and each concurrency C it starts one `conveyor executor` and one
`conveyor worker` (worker.max_concurrent_tasks=C, other settings at their defaults unless
given) as real processes against a fresh scratch database on the running PostgreSQL, then:
  throughput  enqueues N core.noop executions in one transaction and times that commit ->
              the last one ended (database clock); also the CPU time of the two processes
              and the commits made, per execution, and the worker's peak RSS (VmHWM);
  latency     (at --latency-concurrency only) requests core.noop one at a time at a steady
              rate, each its own commit, and reports started - created (database clock).
The reference: pgbench -N (one durable commit per transaction) at 1 and 2 clients on a
scratch database, before and after the runs -- the machine is shared, so read the figures
against it. Prints every setting the figures came from.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from core_kit import (  # bench/, next to this file
    Conn,
    commits,
    connect,
    conveyor_env,
    cpu_seconds,
    delete_broker_objects,
    drop_database,
    ended_since,
    enqueue_noops,
    finished,
    fresh_database,
    paced_latency,
    pct,
    peak_rss_mb,
    reference,
    server_settings,
    start,
    stop,
    wait_for,
)


@dataclass
class Figures:
    transport: str
    concurrency: int
    n: int
    per_second: float
    cpu_ms: float  # executor + worker CPU per execution
    commits: float  # database commits per execution (all processes of the run)
    worker_rss_mb: float
    latency: list[float] | None = None  # ms, sorted


def truncate(conn: Conn) -> None:
    """Empty the execution tables; the running processes' own statements may deadlock with it."""
    for _ in range(20):
        try:
            conn.execute("TRUNCATE execution CASCADE")
            return
        except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable):
            time.sleep(0.1)
    raise SystemExit("cannot truncate the execution tables")


def throughput(conn: Conn, n: int, batch: int, pids: list[int]) -> tuple[float, float, float]:
    """(executions/s, CPU ms per execution, commits per execution) for n core.noop."""
    truncate(conn)
    cpu0, commits0 = cpu_seconds(pids), commits(conn)
    t0 = enqueue_noops(conn, n, batch)
    wait_for(conn, finished(), n, timeout=900)
    cpu1, commits1 = cpu_seconds(pids), commits(conn)
    elapsed, completed = ended_since(conn, t0)
    if completed != n:
        raise SystemExit(f"only {completed} of {n} completed")
    return n / elapsed, (cpu1 - cpu0) * 1000 / n, (commits1 - commits0) / n


def latency(conn: Conn, rate: float, seconds: float) -> list[float]:
    truncate(conn)
    return paced_latency(conn, rate, max(2, int(rate * seconds)))


def run_one(args: argparse.Namespace, transport: str, concurrency: int, n: int) -> Figures:
    """One executor + one worker on ``transport`` at ``concurrency``."""
    name = f"conveyor_bench_{os.getpid()}"
    url = fresh_database(args.url, name)
    env = conveyor_env(
        url,
        transport=transport,
        executor__batch_size=args.batch_size,
        worker__max_concurrent_tasks=concurrency,
        worker__name="bench-worker",
    )
    if args.prefetch is not None:
        env["CONVEYOR__WORKER__PREFETCH"] = str(args.prefetch)
    prefix = f"bench{os.getpid()}c{concurrency}"
    if transport == "rabbitmq":
        env |= {"CONVEYOR__MESSAGE_QUEUE__URL": args.amqp_url, "CONVEYOR__MESSAGE_QUEUE__PREFIX": prefix}
    logdir = Path(tempfile.mkdtemp(prefix=f"conveyor-bench-{transport}-{concurrency}-"))
    procs = [start("executor", env, logdir), start("worker", env, logdir)]
    pids = [p.pid for p in procs]
    try:
        with connect(url) as conn:
            wait_for(conn, "SELECT count(*) FROM worker WHERE status = 'active'", 1, timeout=30)
            throughput(conn, min(n, 500), args.enqueue_batch, pids)  # warm-up
            per_second, cpu_ms, per_commit = throughput(conn, n, args.enqueue_batch, pids)
            rss = peak_rss_mb(procs[1].pid)
            lat = latency(conn, args.rate, args.seconds) if concurrency == args.latency_concurrency else None
    finally:
        stop(procs)
        if transport == "rabbitmq":
            delete_broker_objects(args.amqp_url, prefix, worker_ids=[1])
        drop_database(args.url, name)
    print(f"  {transport} c={concurrency}: {per_second:,.0f}/s (logs: {logdir})", file=sys.stderr)
    return Figures(transport, concurrency, n, per_second, cpu_ms, per_commit, rss, lat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--transport", choices=["postgres", "rabbitmq", "both"], default="both")
    parser.add_argument("--concurrency", default="2,10,500", help="worker.max_concurrent_tasks values, comma-separated")
    parser.add_argument("--n", type=int, default=None, help="executions per throughput run (default: by concurrency)")
    parser.add_argument("--quick", action="store_true", help="fewer executions and a shorter latency run")
    parser.add_argument("--enqueue-batch", type=int, default=5_000, help="rows per enqueue statement")
    parser.add_argument("--batch-size", type=int, default=500, help="executor.batch_size")
    parser.add_argument("--prefetch", type=int, default=None, help="worker.prefetch (default: the setting's default)")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s in the latency run")
    parser.add_argument("--seconds", type=float, default=None, help="length of the latency run (20, quick 6)")
    parser.add_argument("--latency-concurrency", type=int, default=10, help="the worker concurrency of the latency run")
    args = parser.parse_args()
    args.seconds = args.seconds or (6.0 if args.quick else 20.0)
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.latency_concurrency not in levels:
        levels.append(args.latency_concurrency)

    def size(c: int) -> int:
        if args.n:
            return int(args.n)
        full = {2: 5_000, 10: 10_000}.get(c, 20_000)
        return full // 5 if args.quick else full

    transports = ["postgres", "rabbitmq"] if args.transport == "both" else [args.transport]
    ref_before = reference(args.url, 3 if args.quick else 5)
    results = [run_one(args, t, c, size(c)) for t in transports for c in levels]
    ref_after = reference(args.url, 3 if args.quick else 5)

    print("Conveyor core benchmark")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f} at the end (shared machine: read against the reference)")  # fmt: skip
    print("  postgres: " + ", ".join(f"{k}={v}" for k, v in server_settings(args.url).items()))
    if "rabbitmq" in transports:
        print(f"  rabbitmq: {args.amqp_url.split('@')[-1]}, quorum queues, publisher confirms, outbox relay")
    print(f"  processes: 1 executor + 1 worker per row, executor.batch_size={args.batch_size}, "
          f"worker.prefetch={'default' if args.prefetch is None else args.prefetch}, others default")  # fmt: skip
    print(f"  throughput: N core.noop enqueued by {args.enqueue_batch}, enqueue commit -> last ended "
          "(database clock); CPU: executor + worker user+system; commits: xact_commit of the database")  # fmt: skip
    print(f"  latency: core.noop at {args.rate:g}/s for {args.seconds:g}s, one commit each, requested -> started "
          f"(database clock), worker.max_concurrent_tasks={args.latency_concurrency}")  # fmt: skip
    for when, ref in (("before", ref_before), ("after", ref_after)):
        for what, tps, ms in ref:
            print(f"  reference ({when}): {what}: {tps:,.0f} tps, {ms:.2f} ms per transaction")
    print(f"{'transport':<9} {'conc':>5} {'N':>6} {'exec/s':>8} {'CPU ms/ex':>9} {'commits/ex':>10} "
          f"{'worker RSS MB':>13} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}")  # fmt: skip
    for f in results:
        lat = f.latency
        tail = f"{pct(lat, 50):>7.2f} {pct(lat, 95):>7.2f} {pct(lat, 99):>7.2f}" if lat else ""
        print(f"{f.transport:<9} {f.concurrency:>5} {f.n:>6} {f.per_second:>8,.0f} {f.cpu_ms:>9.2f} "
              f"{f.commits:>10.2f} {f.worker_rss_mb:>13.1f} {tail}")  # fmt: skip


if __name__ == "__main__":
    main()
