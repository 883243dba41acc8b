"""Live output benchmark (not a test, issue #15): what live output costs an execution that
prints nothing, and how long a printed line takes to reach a reader.

    python bench/output.py [--n 3000] [--lines 80] [--interval 0.05]

Starts one `conveyor executor`, one `conveyor worker` (max_concurrent_tasks=10) and one
`conveyor api` as real processes on a fresh scratch database, then:
  no-op cost  drains --n queued core.noop and counts what live output wrote meanwhile: rows of
              execution_output and statements of append_output (pg_stat_user_functions);
  delay       runs a core.local command that prints the wall clock (`date +%s.%N`) every
              --interval seconds, --lines times, and follows it at once through the SDK
              (`Client.follow_output`, what `conveyor executions tail --follow` does: woken by
              NOTIFY) and through the API's server-sent events (what the dashboard reads);
              the delay of a line is when a reader got it minus the time it printed (one
              machine, one clock).
Prints the figures, the settings (worker.output_interval among them) and the pgbench
reference of bench/core_kit.py, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from core_kit import (
    connect,
    conveyor_env,
    drop_database,
    enqueue_noops,
    finished,
    fresh_database,
    pct,
    reference,
    server_settings,
    start,
    stop,
    wait_for,
)

from conveyor.domain.tokens import Role, token_row
from conveyor.sdk import Client, request_execution
from conveyor.store.queries import Q

_STAMP = re.compile(rb"^(\d+\.\d+)$", re.M)


def noop_cost(url: str, n: int) -> tuple[int, int, float]:
    """(execution_output rows, append_output calls, executions/s) over a drain of n core.noop."""
    with connect(url) as conn:
        conn.execute("SELECT pg_stat_reset()")
        t0 = enqueue_noops(conn, n, 500)
        wait_for(conn, finished(), n, timeout=600)
        seconds = float(conn.execute("SELECT extract(epoch FROM max(ended) - %s) FROM execution", (t0,)).fetchone()[0])  # type: ignore[index]
        rows = int(conn.execute("SELECT count(*) FROM execution_output").fetchone()[0])  # type: ignore[index]
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'append_output'"
        )
        return rows, int(calls.fetchone()[0]), n / seconds  # type: ignore[index]


def printing_command(lines: int, interval: float) -> str:
    return f"for i in $(seq {lines}); do date +%s.%N; sleep {interval}; done"


def follow_sdk(url: str, eid: int, out: list[float]) -> None:
    with Client(url) as client:
        for chunk in client.follow_output(eid):
            got = time.time()
            out.extend(got - float(m) for m in _STAMP.findall(chunk.data))


def follow_sse(base: str, token: str, eid: int, out: list[float]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{base}/api/v1/executions/{eid}/output/stream", headers=headers, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"stream"' in line:
                got = time.time()
                data = json.loads(line[6:])["data"].encode()
                out.extend(got - float(m) for m in _STAMP.findall(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--lines", type=int, default=80)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument(
        "--output-interval", type=float, default=None, help="worker.output_interval (default: its default)"
    )
    args = parser.parse_args()
    name = f"conveyor_bench_output_{os.getpid()}"
    url = fresh_database(args.url, name)
    with connect(url) as conn:
        conn.execute("SET track_functions = 'pl'")
        conn.execute(f"ALTER DATABASE {name} SET track_functions = 'pl'")
    port = 18000 + os.getpid() % 1000
    settings: dict[str, object] = {"worker__max_concurrent_tasks": 10, "api__port": port, "api__host": "127.0.0.1"}
    if args.output_interval is not None:
        settings["worker__output_interval"] = args.output_interval
    env = conveyor_env(url, **settings)
    logdir = Path(tempfile.mkdtemp(prefix="conveyor-bench-output-"))
    procs = [start(role, env, logdir) for role in ("executor", "worker", "api")]
    try:
        with connect(url) as conn:
            wait_for(conn, "SELECT count(*) FROM worker WHERE status = 'active'", 1, timeout=60)
            token, params = token_row("bench", Role.viewer)
            conn.execute(Q["create_token"], params)
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(f"{base}/health/live", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        rows, calls, per_s = noop_cost(url, args.n)
        with connect(url) as conn:
            eid = request_execution(conn, "core.local", {"cmd": printing_command(args.lines, args.interval)})
        sdk: list[float] = []
        sse: list[float] = []
        readers = [threading.Thread(target=follow_sdk, args=(url, eid, sdk)),
                   threading.Thread(target=follow_sse, args=(base, token, eid, sse))]  # fmt: skip
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout=120)
        with connect(url) as conn:  # the same counters after a run that prints: they do count
            printed = conn.execute(
                "SELECT (SELECT count(*) FROM execution_output),"
                " (SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'append_output')"
            ).fetchone()
        print(f"# bench/output.py  {platform.node()}  cpus={os.cpu_count()}  python {sys.version.split()[0]}")
        print("# server:", "  ".join(f"{k}={v}" for k, v in server_settings(url).items()))
        print(f"# worker.max_concurrent_tasks=10  worker.output_interval={args.output_interval or 'default (0.25)'}"
              f"  lines={args.lines} every {args.interval}s")  # fmt: skip
        for what, tps, ms in reference(args.url, 5):
            print(f"reference  {what:<22} {tps:>9,.0f} tps  {ms:.2f} ms")
        print(f"no-op drain of {args.n}: {per_s:,.0f} executions/s;"
              f" live output wrote {rows} rows in {calls} append_output calls")  # fmt: skip
        assert printed is not None
        print(f"the printing run ({args.lines} lines): {printed[0]} rows in {printed[1]} append_output calls")
        for label, delays in (("SDK follow_output (conveyor executions tail -f)", sdk), ("API SSE (dashboard)", sse)):
            got = sorted(1000 * d for d in delays)
            if got:
                print(f"print -> {label}: p50 {pct(got, 50):.0f} ms  p99 {pct(got, 99):.0f} ms"
                      f"  max {got[-1]:.0f} ms  (lines={len(got)})")  # fmt: skip
            else:
                print(f"print -> {label}: no line received")
    finally:
        stop(procs)
        drop_database(args.url, name)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
