"""Events benchmark (not a test): webhook -> execution requested, and schedules every second.

    python bench/events.py [--webhooks 2000] [--senders 8] [--schedules 100] [--seconds 120]
                           [--executors 2] [--only webhooks,schedules]

(run from a checkout with ``PYTHONPATH=src``), against an already-running PostgreSQL (a fresh
database each part, as bench/core.py does):

  0. reference: plain single-statement INSERTs (autocommit, one connection) per second on
     the same server, so a slow machine can be told from a slow Conveyor;
  a. webhooks: a real ``conveyor api`` (127.0.0.1, a free port), ``--executors`` executors
     and a worker; a webhook with an HMAC secret and a rule on its trigger requesting
     core.noop. ``--senders`` threads POST ``--webhooks`` signed deliveries (one key each).
     Figures: deliveries/s accepted at the door (202s over the POSTs' wall time);
     execution requested end to end, p50/p99 of ``execution.created - event.received``
     (database clock) and of ``execution.created`` - the POST's start (the client's clock:
     same machine);
  b. schedules: ``--schedules`` interval schedules of 1 s for ``--seconds``
     (bench/schedules.py's measure): lag (fired - slot) p50/p99, missed and doubled slots.
     Target: none missed or doubled, p99 <= 250 ms.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).parent))
from core import fresh_database, pct, wait_for
from schedules import describe as describe_slots
from schedules import measure as measure_slots
from schedules import start

SCHEMA = "conveyor"
SECRET = "bench-secret"


def reference(url: str, n: int = 2000) -> float:
    """Single-statement INSERTs per second (each its own commit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE ref (id bigserial PRIMARY KEY, v text)")
        began = time.perf_counter()
        for i in range(n):
            conn.execute("INSERT INTO ref (v) VALUES (%s)", (str(i),))
        return n / (time.perf_counter() - began)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(base: str, timeout: float) -> None:
    """Any HTTP answer: the API is up (its log stays at warning: no line per request)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{base}/api/v1/webhooks/none", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"no API at {base} after {timeout:g} s")


def post_all(base: str, n: int, senders: int, prefix: str = "k") -> tuple[float, dict[str, float], dict[int, int]]:
    """POST n signed deliveries from ``senders`` threads: wall time, each key's POST start
    (unix time) and the statuses."""
    started: dict[str, float] = {}
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    url = f"{base}/api/v1/webhooks/bench-hook"

    def send(chunk: range) -> None:
        with httpx.Client(timeout=30) as http:
            for i in chunk:
                body = json.dumps({"kind": "go", "n": i}).encode()
                sig = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
                headers = {
                    "Content-Type": "application/json",
                    "X-Hub-Signature-256": sig,
                    "Idempotency-Key": f"{prefix}{i}",
                }
                t = time.time()
                status = http.post(url, content=body, headers=headers).status_code
                with lock:
                    started[f"{prefix}{i}"] = t
                    statuses[status] = statuses.get(status, 0) + 1

    began = time.perf_counter()
    with ThreadPoolExecutor(senders) as pool:
        list(pool.map(send, [range(k, n, senders) for k in range(senders)]))
    return time.perf_counter() - began, started, statuses


def webhooks(server_url: str, n: int, senders: int, executors: int) -> dict[str, Any]:
    url = fresh_database(server_url, "conveyor_bench_events")
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "CONVEYOR__LOG__LEVEL": "warning"}
    env |= {"CONVEYOR__API__HOST": "127.0.0.1", "CONVEYOR__API__PORT": str(port)}
    logdir = Path(tempfile.mkdtemp(prefix="conveyor-bench-events-"))
    procs = [start(f"executor{i + 1}", "executor", env, logdir) for i in range(executors)]
    procs.append(start("worker", "worker", env | {"CONVEYOR__WORKER__NAME": "bench-worker"}, logdir))
    procs.append(start("api", "api", env, logdir))
    try:
        wait_listening(f"http://127.0.0.1:{port}", 60)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {SCHEMA}")
            conn.execute("SELECT * FROM register_webhook('bench-hook', 'bench.hook', 'hmac', secret => %s)", (SECRET,))
            crit = json.dumps({"trigger.body.kind": {"type": "equals", "pattern": "go"}})
            conn.execute("SELECT * FROM register_rule('bench.go', 'bench.hook', %s, 'core.noop', '{}')", (crit,))
            wait_for(conn, "SELECT count(*) FROM worker WHERE status = 'active'", 1, timeout=30)
            post_all(f"http://127.0.0.1:{port}", 20, 2, prefix="warm")  # connections, caches
            query = "SELECT count(*) FROM enforcement"
            wait_for(conn, query, 20, timeout=60)
            wall, started, statuses = post_all(f"http://127.0.0.1:{port}", n, senders)
            wait_for(conn, query, n + 20, timeout=300)
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    "SELECT ev.idempotency_key AS key, extract(epoch FROM ev.received) AS received, "
                    "extract(epoch FROM e.created) AS created FROM event ev "
                    "JOIN enforcement f ON f.event = ev.id JOIN execution e ON e.id = f.execution "
                    "WHERE ev.idempotency_key NOT LIKE 'warm%%'"
                )
                .fetchall()
            )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    accepted = statuses.get(202, 0)
    return {
        "posts": n, "statuses": statuses, "wall": wall, "door_rate": accepted / wall, "requested": len(rows),
        "event_lag": [float(r["created"]) - float(r["received"]) for r in rows],
        "post_lag": [float(r["created"]) - started[r["key"]] for r in rows if r["key"] in started],
        "logs": str(logdir),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--webhooks", type=int, default=2000)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--only", default="webhooks,schedules")
    args = parser.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"0. reference: {reference(args.url):.0f} single-statement INSERTs/s (autocommit, one connection)")
    if "webhooks" in args.only:
        w = webhooks(args.url, args.webhooks, args.senders, args.executors)
        print(f"a. webhooks={args.webhooks} senders={args.senders} executors={args.executors} "
              f"rule -> core.noop; answers {w['statuses']}")  # fmt: skip
        print(f"  door: {w['door_rate']:.0f} deliveries/s accepted ({w['wall']:.1f} s of POSTs); "
              f"{w['requested']} executions requested")  # fmt: skip
        for label, values in (("event.received", w["event_lag"]), ("POST start", w["post_lag"])):
            if len(values) >= 2:
                print(f"  execution.created - {label}: p50={pct(values, 50) * 1000:.0f} ms "
                      f"p99={pct(values, 99) * 1000:.0f} ms max={max(values) * 1000:.0f} ms")  # fmt: skip
        print(f"  logs: {w['logs']}", file=sys.stderr)
    if "schedules" in args.only:
        url = fresh_database(args.url, "conveyor_bench_events_schedules")  # not bench/schedules.py's
        out = measure_slots(url, args.schedules, args.seconds, args.executors)
        print(f"b. schedules={args.schedules} every=1s seconds={args.seconds:g} executors={args.executors} "
              "core.noop (target: none missed or doubled, p99 <= 250 ms)")  # fmt: skip
        print("\n".join(describe_slots(out)))
        print(f"  logs: {out['logs']}", file=sys.stderr)


if __name__ == "__main__":
    main()
