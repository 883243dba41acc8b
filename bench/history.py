"""History benchmark (not a test): is the cost per execution flat from an empty table to 10M finished rows?

    python bench/history.py [--url postgresql://postgres@127.0.0.1/postgres] [--rows 10000000]
                            [--n 20000] [--rate 50 --seconds 20] [--repeat 3] [--keep] [--fill-only]

In a fresh database ``conveyor_history`` it:
  1. measures against the (nearly) empty tables: one ``conveyor executor`` and one ``conveyor worker`` as
     real processes (bench/core_kit.py's helpers), throughput of N core.noop (enqueue commit -> last ended) and
     request -> start latency at a steady rate, each ``--repeat`` times, plus a reference;
  2. stops them and fills ``--rows`` finished executions and their execution_attempt rows with COPY (timed:
     the fill rate is printed), then VACUUM (ANALYZE)s them as autovacuum would have, and CHECKPOINTs;
  3. starts fresh processes and measures the same figures against the full tables.
The reference, measured in each phase, is a single-statement loop that does not touch the history (one
autocommit UPDATE of a one-row table, statements/s): it tells a busier machine from a slower Conveyor.
The fill runs with ``session_replication_role = replica`` (no triggers, no FK checks): finished rows
cannot be inserted through the guarded path, which only inserts ``requested`` ones.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from core_kit import (  # bench/, next to this file
    Conn,
    connect,
    conveyor_env,
    drop_database,
    ended_since,
    enqueue_noops,
    finished,
    fresh_database,
    paced_latency,
    pct,
    server_settings,
    start,
    stop,
    update_rate,
    wait_for,
)
from psycopg.copy import QueuedLibpqWriter

# Finished statuses in a plausible mix, and the attempt outcome each ends with.
MIX = (("completed", 900), ("failed", 60), ("cancelled", 20), ("timeout", 10), ("abandoned", 10))
OUTCOME = {"abandoned": "worker_lost"}
CHUNK = 50_000  # rows per COPY write


def reference(url: str, seconds: float = 3.0) -> float:
    """Statements/s of a one-row autocommit UPDATE loop (each a durable commit)."""
    with connect(url) as conn:
        return update_rate(conn, "public.bench_reference", seconds)


def watermark(conn: Conn) -> int:
    row = conn.execute("SELECT coalesce(max(id), 0) FROM execution").fetchone()
    assert row
    return int(row[0])


def throughput(url: str, n: int, batch: int) -> float:
    with connect(url) as conn:
        after = watermark(conn)
        t0 = enqueue_noops(conn, n, batch)
        wait_for(conn, finished(after), n, timeout=600)
        elapsed, completed = ended_since(conn, t0, after)
    if completed != n:
        raise SystemExit(f"only {completed} of {n} completed")
    return n / elapsed


def latency(url: str, rate: float, seconds: float) -> list[float]:
    with connect(url) as conn:
        return paced_latency(conn, rate, int(rate * seconds), after=watermark(conn))


def measure(args: argparse.Namespace, url: str, label: str) -> dict[str, Any]:
    """One executor + one worker against ``url``: throughput and latency, ``repeat`` times each."""
    env = conveyor_env(
        url,
        transport="postgres",
        executor__batch_size=args.batch_size,
        worker__max_concurrent_tasks=args.concurrency,
        worker__name="bench-worker",
    )
    logdir = Path(tempfile.mkdtemp(prefix=f"conveyor-history-{label}-"))
    procs = [start("executor", env, logdir), start("worker", env, logdir)]
    try:
        with connect(url) as conn:
            wait_for(conn, "SELECT count(*) FROM worker WHERE status = 'active'", 1, timeout=30)
        ref = reference(url)
        throughput(url, 500, args.enqueue_batch)  # warm-up
        tputs = [throughput(url, args.n, args.enqueue_batch) for _ in range(args.repeat)]
        lats = [latency(url, args.rate, args.seconds) for _ in range(args.repeat)]
        ref = (ref + reference(url)) / 2
    finally:
        stop(procs)
    print(f"  {label} logs: {logdir}", file=sys.stderr)
    merged = sorted(v for lat in lats for v in lat)
    return {"tput": statistics.median(tputs), "tputs": tputs, "lat": merged, "ref": ref}


def stamp(t: float, _cache: dict[int, str] = {}) -> str:  # noqa: B006 - a deliberate cache
    """COPY text of a UTC timestamp; strftime once per second (it dominated the fill's client side)."""
    second = int(t)
    prefix = _cache.get(second)
    if prefix is None:
        _cache.clear()
        prefix = _cache[second] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second))
    return f"{prefix}.{int((t - second) * 1e6):06d}+00"


def history_rows(first_id: int, rows: int, worker: int, worker_name: str, seed: int) -> Iterator[tuple[str, str]]:
    """(execution line, execution_attempt line) in COPY text format, finished over the last 30 days."""
    rng = random.Random(seed)
    statuses = [s for s, weight in MIX for _ in range(weight)]
    now = time.time()
    for i in range(rows):
        eid = first_id + i
        status = statuses[rng.randrange(len(statuses))]
        created = now - 30 * 86400 + 30 * 86400 * i / rows  # ids grow with time, as they do
        started, ended = created + 0.002, created + 0.002 + rng.random() * 0.05
        ts = [stamp(t) for t in (created, started, ended)]
        if i % 4:
            action, params = "core.noop", "{}"
        else:
            action, params = "core.echo", f'{{"message": "history row {eid}"}}'
        ok = status == "completed"
        result = '{"succeeded": true, "result": null}' if ok else '{"succeeded": false, "error": "boom"}'
        yield (
            f"{eid}\t{action}\t{params}\t{status}\t{result}\t{worker}\tbench\t1\t{ts[0]}\t{ts[2]}\t{ts[0]}\t{ts[1]}\t{ts[2]}\n",
            f"{eid}\t1\t{worker}\t{worker_name}\t{ts[0]}\t{ts[1]}\t{ts[2]}\t{OUTCOME.get(status, status)}\t"
            + ("\\N" if ok else "boom")
            + "\n",
        )


def fill(url: str, rows: int) -> float:
    """COPY ``rows`` finished executions (+ one attempt each); returns rows/s of the COPY (VACUUM excluded)."""
    with connect(url) as conn:
        row = conn.execute("SELECT id, name FROM worker ORDER BY id LIMIT 1").fetchone()
        assert row, "no worker row: run the empty phase first"
        worker, worker_name = int(row[0]), str(row[1])
        row = conn.execute("SELECT setval('execution_id_seq', nextval('execution_id_seq') + %s)", (rows,)).fetchone()
        assert row
        first_id = int(row[0]) - rows + 1
        begin = time.monotonic()
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            ex_cols = (
                "id, action_ref, parameters, status, result, worker, executor, attempt, created, updated, "
                "scheduled, started, ended"
            )
            at_cols = "execution, attempt, worker, worker_name, scheduled, started, ended, outcome, error"
            for table, cols, part in (("execution", ex_cols, 0), ("execution_attempt", at_cols, 1)):
                # One COPY at a time per connection: the rows are generated again rather than held.
                with (
                    conn.cursor() as cur,
                    cur.copy(f"COPY {table} ({cols}) FROM STDIN", writer=QueuedLibpqWriter(cur)) as copy,
                ):
                    buf: list[str] = []
                    for lines in history_rows(first_id, rows, worker, worker_name, seed=14):
                        buf.append(lines[part])
                        if len(buf) >= CHUNK:
                            copy.write("".join(buf))
                            buf.clear()
                    copy.write("".join(buf))
        elapsed = time.monotonic() - begin
        print(f"  filled {rows:,} executions + {rows:,} attempts in {elapsed:.1f}s", file=sys.stderr)
        vbegin = time.monotonic()
        conn.execute("VACUUM (ANALYZE) execution")
        conn.execute("VACUUM (ANALYZE) execution_attempt")
        print(f"  VACUUM (ANALYZE) in {time.monotonic() - vbegin:.1f}s", file=sys.stderr)
        # The fill leaves gigabytes of dirty pages; without a checkpoint here the server
        # writes them out (and fsyncs them) during the full phase, and the commits measured
        # there wait behind that I/O: the fill's cost, not the history's.
        cbegin = time.monotonic()
        conn.execute("CHECKPOINT")
        print(f"  CHECKPOINT in {time.monotonic() - cbegin:.1f}s", file=sys.stderr)
    return rows / elapsed


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several phases' measurements as one: every run's throughput, every latency sample."""
    tputs = [t for r in results for t in r["tputs"]]
    lat = sorted(v for r in results for v in r["lat"])
    return {
        "tput": statistics.median(tputs),
        "tputs": tputs,
        "lat": lat,
        "ref": statistics.mean(r["ref"] for r in results),
    }


def sizes(url: str) -> tuple[str, str, int]:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('execution')),"
            " pg_size_pretty(pg_total_relation_size('execution_attempt')),"
            " (SELECT reltuples::bigint FROM pg_class WHERE oid = 'execution'::regclass)"
        ).fetchone()
        assert row
        return str(row[0]), str(row[1]), int(row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--database", default="conveyor_history", help="database created (dropped first)")
    parser.add_argument("--rows", type=int, default=10_000_000, help="finished executions filled")
    parser.add_argument("--n", type=int, default=20_000, help="executions per throughput run")
    parser.add_argument("--enqueue-batch", type=int, default=5_000, help="rows per enqueue statement")
    parser.add_argument("--batch-size", type=int, default=500, help="executor.batch_size")
    parser.add_argument("--concurrency", type=int, default=500, help="worker.max_concurrent_tasks")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s in the latency run")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each latency run")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement per phase")
    parser.add_argument("--keep", action="store_true", help="keep the filled database afterwards")
    parser.add_argument("--fill-only", action="store_true", help="create and fill the database, measure nothing")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="no fill: measure the filled --database (kept by --keep) against a fresh empty one, alternating "
        "empty/full --rounds times (drift in the machine's load then hits both alike)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="empty/full alternations with --reuse")
    args = parser.parse_args()

    names = ("server_version", "synchronous_commit", "shared_buffers", "work_mem", "autovacuum")
    settings = server_settings(args.url, names)
    if args.reuse:
        url = psycopg.conninfo.make_conninfo(args.url, dbname=args.database)
        empty_url = fresh_database(args.url, f"{args.database}_empty")
        with connect(empty_url) as conn:
            conn.execute(
                "INSERT INTO worker (name, status, runtimes, stale_after) VALUES ('bench-worker', 'inactive', '{}', 30)"
            )
        empties, fulls = [], []
        for _ in range(args.rounds):
            empties.append(measure(args, empty_url, "empty"))
            fulls.append(measure(args, url, "full"))
        report(args, settings, None, sizes(url), merge(empties), merge(fulls))
        drop_database(args.url, f"{args.database}_empty")
        return
    url = fresh_database(args.url, args.database)
    with connect(url) as conn:  # the worker row the history points at (the bench worker takes it over)
        conn.execute(
            "INSERT INTO worker (name, status, runtimes, stale_after) VALUES ('bench-worker', 'inactive', '{}', 30)"
        )
    if args.fill_only:
        rate = fill(url, args.rows)
        print(f"filled {args.rows:,} rows at {rate:,.0f} rows/s into {args.database}")
        return
    empty = measure(args, url, "empty")
    rate = fill(url, args.rows)
    full = measure(args, url, "full")
    report(args, settings, rate, sizes(url), empty, full)
    if not args.keep:
        drop_database(args.url, args.database)


def report(
    args: argparse.Namespace,
    settings: dict[str, Any],
    rate: float | None,
    size: tuple[str, str, int],
    empty: dict[str, Any],
    full: dict[str, Any],
) -> None:
    print("Conveyor history benchmark")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("  postgres: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(
        f"  processes: 1 executor + 1 worker (postgres transport), executor.batch_size={args.batch_size}, "
        f"worker.max_concurrent_tasks={args.concurrency}"
    )
    filled = f"by COPY at {rate:,.0f} rows/s" if rate else "(reused)"
    print(
        f"  history: ~{size[2]:,} finished executions + attempts {filled} "
        f"(execution {size[0]}, execution_attempt {size[1]} with indexes)"
    )
    print(
        f"  throughput: {args.n} core.noop per run, median of {len(empty['tputs'])}; latency: {args.rate:g}/s for "
        f"{args.seconds:g}s x {len(empty['tputs'])}, requested -> started (database clock)"
    )
    print("  reference: one-row autocommit UPDATE loop, statements/s (same database, not touching history)")
    print(f"{'history':<12} {'executions/s':>13} {'runs':>30} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'ref/s':>7}")
    for label, res in (("empty", empty), (f"{size[2]:,}", full)):
        lat: list[float] = res["lat"]
        runs = "/".join(f"{t:,.0f}" for t in res["tputs"])
        print(
            f"{label:<12} {res['tput']:>13,.0f} {runs:>30} {pct(lat, 50):>7.2f} {pct(lat, 95):>7.2f} "
            f"{pct(lat, 99):>7.2f} {res['ref']:>7,.0f}"
        )
    ratio = float(full["tput"]) / float(empty["tput"])
    lat_ratio = pct(full["lat"], 50) / pct(empty["lat"], 50)
    print(f"full/empty: throughput {ratio:.2f}x, latency p50 {lat_ratio:.2f}x")


if __name__ == "__main__":
    main()
