"""Schedule benchmark (not a test): many schedules firing every second.

    python bench/schedules.py [--schedules 100] [--seconds 120] [--executors 2] [--events]

(run from a checkout with ``PYTHONPATH=src``). Creates ``--schedules`` interval schedules
of 1 s (core.noop, or events with ``--events``) on a fresh database of an already-running
PostgreSQL (as bench/core.py does), starts ``--executors`` ``conveyor executor`` processes
and one ``conveyor worker``, lets them fire for ``--seconds``, then reads schedule_slot
(database clock): lag (fired - slot) p50 / p99 / max of the slots in the window, slots
missed (a gap in a schedule's 1-second sequence, or outcome missed) and doubled (two rows
for one slot: impossible by the primary key, counted anyway). Target: none missed or
doubled, p99 <= 250 ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from core import fresh_database, pct, wait_for

SCHEMA = "conveyor"
DATABASE = "conveyor_bench_schedules"

STATS = """
WITH s AS (SELECT ss.*, extract(epoch FROM ss.fired - ss.slot) AS lag FROM schedule_slot ss
           WHERE ss.slot >= %(since)s AND ss.slot < %(until)s)
SELECT count(*) AS slots,
       count(*) FILTER (WHERE outcome = 'missed') AS missed,
       count(*) - count(DISTINCT (schedule, slot)) AS doubled,
       array_agg(lag ORDER BY lag) FILTER (WHERE origin = 'scheduled') AS lags
FROM s
"""
# Gaps: a schedule's consecutive slots more than 1 s apart in the window (a slot never fired).
GAPS = """
SELECT coalesce(sum(round(extract(epoch FROM gap)) - 1), 0)::int AS lost FROM (
    SELECT slot - lag(slot) OVER (PARTITION BY schedule ORDER BY slot) AS gap
    FROM schedule_slot WHERE slot >= %(since)s AND slot < %(until)s) g
WHERE gap > interval '1.5 s'
"""


def start(name: str, role: str, env: dict[str, str], logdir: Path) -> subprocess.Popen[bytes]:
    log = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen([sys.executable, "-m", "conveyor", role], env=env, stdout=log, stderr=log)


def measure(url: str, schedules: int, seconds: float, executors: int, events: bool = False) -> dict[str, Any]:
    """``schedules`` interval schedules of 1 s fired for ``seconds`` by ``executors``
    executors (and one worker) on the fresh database ``url``: slots, missed, never fired,
    doubled and the lags (seconds) of the slots in the window. bench/events.py uses it too."""
    env = {**os.environ, "DATABASE_URL": url, "CONVEYOR__LOG__LEVEL": "warning"}
    logdir = Path(tempfile.mkdtemp(prefix="conveyor-bench-schedules-"))
    procs = [start(f"executor{i + 1}", "executor", env, logdir) for i in range(executors)]
    procs.append(start("worker", "worker", env | {"CONVEYOR__WORKER__NAME": "bench-worker"}, logdir))
    out: dict[str, Any] = {"logs": str(logdir)}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {SCHEMA}")
            wait_for(conn, "SELECT count(*) FROM worker WHERE status = 'active'", 1, timeout=30)
            action = None if events else "core.noop"
            with conn.transaction():
                for i in range(schedules):
                    conn.execute("SELECT create_schedule(%s, 'interval', every => interval '1 second', "
                                 "action_ref => %s)", (f"bench{i}", action))  # fmt: skip
            # Measure a window that starts after the warm-up second and ends a second early.
            since = conn.execute("SELECT now() + interval '2 s'").fetchone()[0]  # type: ignore[index]
            time.sleep(seconds + 2)
            until = conn.execute("SELECT now() - interval '1 s'").fetchone()[0]  # type: ignore[index]
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            stats = cur.execute(STATS, {"since": since, "until": until}).fetchone()
            lost = cur.execute(GAPS, {"since": since, "until": until}).fetchone()
            assert stats is not None
            assert lost is not None
            out |= {"slots": stats["slots"], "missed": stats["missed"], "doubled": stats["doubled"],
                    "never_fired": lost["lost"], "lags": [float(x) for x in stats["lags"] or []]}  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    return out


def describe(out: dict[str, Any]) -> list[str]:
    lags = out.get("lags", [])
    lines = [f"  slots={out.get('slots')} missed={out.get('missed')} never_fired={out.get('never_fired')} "
             f"doubled={out.get('doubled')}"]  # fmt: skip
    if len(lags) >= 2:
        lines.append(f"  lag p50={pct(lags, 50) * 1000:.1f} ms p99={pct(lags, 99) * 1000:.1f} ms "
                     f"max={max(lags) * 1000:.1f} ms")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--events", action="store_true", help="schedules without an action: emit events")
    args = parser.parse_args()

    url = fresh_database(args.url, DATABASE)
    out = measure(url, args.schedules, args.seconds, args.executors, args.events)
    print(f"schedules={args.schedules} every=1s seconds={args.seconds:g} executors={args.executors} "
          f"{'events' if args.events else 'core.noop'}")  # fmt: skip
    print("\n".join(describe(out)))
    print(f"  logs: {out['logs']}", file=sys.stderr)


if __name__ == "__main__":
    main()
