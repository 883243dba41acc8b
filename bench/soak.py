"""Soak benchmark (not a test): the worker's memory at N executions in flight, over time.

    python bench/soak.py [--minutes 60] [--in-flight 500] [--sleep 20] [--sample 30]

Starts one `conveyor executor` and one `conveyor worker` (worker.max_concurrent_tasks =
--in-flight) against a fresh scratch database, keeps --in-flight `core.sleep` executions
of --sleep seconds in flight for --minutes (topping up as they end), and samples the
worker's resident set (VmRSS) every --sample seconds. Prints the samples, the peak
(VmHWM), the first and last tenth's averages and their difference (flat means the worker
keeps nothing per execution it ran), with the executions completed. Long sleeps keep the
machine's load low, so the soak can run beside other work: memory is the figure here,
not speed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from core_kit import SCHEMA, drop_database, fresh_database, peak_rss_mb, start, stop, wait_for

from conveyor.sdk import request_executions


def rss_mb(pid: int) -> float:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(match.group(1)) / 1024 if match else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_url = "postgresql://postgres@127.0.0.1:5432/postgres"
    parser.add_argument("--url", default=os.environ.get("BENCH_DATABASE_URL", default_url))
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--sleep", type=float, default=20.0)
    parser.add_argument("--sample", type=float, default=30.0)
    args = parser.parse_args()

    name = f"conveyor_soak_{os.getpid()}"
    url = fresh_database(args.url, name)
    logdir = Path(tempfile.mkdtemp(prefix="conveyor-soak-"))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CONVEYOR__WORKER__MAX_CONCURRENT_TASKS": str(args.in_flight),
        "CONVEYOR__WORKER__NAME": "soak-worker",
        "CONVEYOR__LOG__LEVEL": "warning",
    }
    procs = [start("executor", env, logdir), start("worker", env, logdir)]
    worker = procs[1]
    samples: list[tuple[float, float, int]] = []  # (minutes, RSS MB, completed so far)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"SET search_path = {SCHEMA}")
            wait_for(conn, "SELECT count(*) > 0 FROM worker WHERE status = 'active'", True, 60)
            began = time.monotonic()
            next_sample = began
            end = began + args.minutes * 60
            while time.monotonic() < end:
                live = conn.execute(
                    "SELECT count(*) FROM execution WHERE status NOT IN"
                    " ('completed', 'failed', 'timeout', 'cancelled', 'abandoned')"
                ).fetchone()[0]  # type: ignore[index]
                if live < args.in_flight:
                    request_executions(conn, [("core.sleep", {"seconds": args.sleep})] * (args.in_flight - live))
                if time.monotonic() >= next_sample:
                    done = conn.execute("SELECT count(*) FROM execution WHERE status = 'completed'").fetchone()[0]  # type: ignore[index]
                    at = (time.monotonic() - began) / 60
                    samples.append((at, rss_mb(worker.pid), int(done)))
                    print(f"{at:6.1f} min  worker RSS {samples[-1][1]:6.1f} MB  in flight {live:4d}  "
                          f"completed {done}", flush=True)  # fmt: skip
                    next_sample += args.sample
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited ({worker.returncode}); logs in {logdir}")
                time.sleep(1.0)
            peak = peak_rss_mb(worker.pid)
    finally:
        stop(procs)
        drop_database(args.url, name)
    tenth = max(1, len(samples) // 10)
    first = statistics.fmean(s[1] for s in samples[:tenth])
    last = statistics.fmean(s[1] for s in samples[-tenth:])
    print(f"\nsettings: in flight {args.in_flight}, core.sleep {args.sleep:g} s, {args.minutes:g} min, "
          f"sampled every {args.sample:g} s; python {sys.version.split()[0]}")  # fmt: skip
    print(f"worker RSS: peak (VmHWM) {peak:.1f} MB; first tenth {first:.1f} MB, last tenth {last:.1f} MB, "
          f"drift {last - first:+.1f} MB; executions completed {samples[-1][2] if samples else 0}")  # fmt: skip


if __name__ == "__main__":
    main()
