"""The database's ceiling (not a test): how many executions/s this machine's PostgreSQL can
take through Conveyor's own statements when nothing else spends a cycle.

    python bench/floor.py [--n 40000] [--lanes 2] [--batch 500,2]

No Conveyor process runs. Each of --lanes threads plays an executor and a worker at once
and walks batches of core.noop through the exact named queries of their life -- request
(request_execution_batch), claim_requested, assign, claim_scheduled, finish -- with the
commits the processes make (relaxed for the executor's two, durable for the worker's two).
A batch of 500 is what Conveyor does at 500 in flight; a batch of 2 is the round trips of a
worker with two slots. Python does one call per batch, so the figure is the database's.

Beside it, in the same run, the same lanes drive the leanest queue one could write: one
table (id, status, payload), one partial index on the waiting rows, insert -> SKIP LOCKED
update to running (durable) -> update to done (durable). It is the reference: what a
queue with no attempts, fencing, guards or wake-ups costs here.

The lanes leave out what a real round adds (live_workers twice, pick_executor_run, the
wake-ups' listeners), so the ceiling is generous.

Then the latency floor: one execution at a time through the same path as the processes take
it between a request's commit and its start -- the executor's claim transaction, its dispatch
transaction (each pipelined as the executor sends it, live_workers included), the worker's
durable claim -- timed from the request's commit to the claim's, with no wake-up to wait for
and no Python work between the statements. No request can start sooner through this path.

Prints executions/s, PostgreSQL CPU per execution (the lanes' backends, /proc), the latency
floor's p50/p99, and the settings. The figures bound what any change to the processes alone
can reach.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from core_kit import Conn, connect, cpu_seconds, drop_database, fresh_database, pct, reference, server_settings
from psycopg.types.json import Jsonb

from conveyor.sdk import request_executions
from conveyor.store.queries import Q

LEAN = """
CREATE TABLE lean (id bigserial PRIMARY KEY, status text NOT NULL, payload jsonb NOT NULL,
                   created timestamptz NOT NULL DEFAULT now(), started timestamptz, ended timestamptz);
CREATE INDEX lean_waiting ON lean (id) WHERE status = 'waiting';
"""
LEAN_CLAIM = """
UPDATE lean SET status = 'running', started = now()
WHERE id IN (SELECT id FROM lean WHERE status = 'waiting' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id
"""


def setup(conn: Conn, lanes: int) -> list[int]:
    """The core.noop action and one registered worker per lane; returns the worker ids."""
    conn.execute(
        Q["upsert_action"],
        {"ref": "core.noop", "pack": "core", "name": "noop", "description": "", "runner_type": "python",
         "runtime": "python", "parameters_schema": "{}", "metadata": "{}"},
    )  # fmt: skip
    ids = []
    for lane in range(lanes):
        row = conn.execute(
            Q["register_worker"],
            {"name": f"floor-{lane}", "status": "active", "runtimes": [], "actions": ["core.noop"],
             "capabilities": "{}", "capacity": 1000, "host": "floor", "pid": os.getpid(), "version": "floor",
             "stale_after": 60, "lock_grace": 5, "session_tag": None},
        ).fetchone()  # fmt: skip
        assert row
        ids.append(int(row[0]))
    return ids


def conveyor_lane(conn: Conn, worker: int, lane: int, count: int, batch: int) -> None:
    executor = f"floor-executor-{lane}"
    done = 0
    while done < count:
        k = min(batch, count - done)
        request_executions(conn, [("core.noop", {})] * k)
        with conn.transaction():
            conn.execute(Q["relaxed_commit"])
            claimed = conn.execute(
                Q["claim_requested"], {"refs": ["core.noop"], "runtimes": [], "limit": k, "executor": executor}
            ).fetchall()
        ids = [int(r[0]) for r in claimed]
        with conn.transaction():
            conn.execute(Q["relaxed_commit"])
            conn.execute(Q["lock_assignment"])
            conn.execute(Q["assign"], {"ids": ids, "workers": [worker] * len(ids), "executor": executor})
        started = conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": k}).fetchall()
        n = len(started)
        conn.execute(
            Q["finish"],
            {"worker": worker, "ids": [r[0] for r in started], "attempts": [r[1] for r in started],
             "statuses": ["completed"] * n, "outcomes": ["completed"] * n, "delays": [None] * n,
             "results": [Jsonb({})] * n, "errors": [None] * n},
        )  # fmt: skip
        done += n


def lean_lane(conn: Conn, worker: int, lane: int, count: int, batch: int) -> None:
    done = 0
    while done < count:
        k = min(batch, count - done)
        conn.execute("INSERT INTO lean (status, payload) SELECT 'waiting', '{}' FROM generate_series(1, %s)", (k,))
        ids = [r[0] for r in conn.execute(LEAN_CLAIM, (k,)).fetchall()]
        conn.execute("UPDATE lean SET status = 'done', ended = now() WHERE id = ANY(%s)", (ids,))
        done += len(ids)


Lane = Callable[[Conn, int, int, int, int], None]


def run(url: str, lane_fn: Lane, workers: list[int], n: int, batch: int) -> tuple[float, float]:
    """(executions/s, PostgreSQL CPU ms per execution) for n executions over the lanes."""
    conns = [connect(url) for _ in workers]
    pids = [c.info.backend_pid for c in conns]
    per_lane = n // len(conns)
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            lane_fn(conns[i], workers[i], i, per_lane, batch)
        except BaseException as exc:  # surfaced below: a lane that failed voids the figure
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(conns))]
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    total = per_lane * len(conns)
    return total / wall, 1000 * cpu / total


def latency_floor(url: str, worker: int, k: int) -> list[float]:
    """Request -> start in ms for ``k`` executions, one at a time, with nothing between the
    statements of the path; sorted."""
    out = []
    with connect(url) as conn:
        for _ in range(k):
            request_executions(conn, [("core.noop", {})])  # its own commit
            t0 = time.perf_counter()
            with conn.pipeline(), conn.transaction():
                conn.execute(Q["relaxed_commit"])
                conn.execute(Q["live_workers"])
                claiming = conn.execute(
                    Q["claim_requested"], {"refs": ["core.noop"], "runtimes": [], "limit": 500, "executor": "floor"}
                )
                conn.execute(Q["pick_executor_run"], {"limit": 500})
                ids = [int(r[0]) for r in claiming.fetchall()]
            with conn.pipeline(), conn.transaction():
                conn.execute(Q["relaxed_commit"])
                conn.execute(Q["lock_assignment"])
                conn.execute(Q["live_workers"])
                conn.execute(Q["assign"], {"ids": ids, "workers": [worker] * len(ids), "executor": "floor"})
            started = conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 500}).fetchall()
            out.append(1000 * (time.perf_counter() - t0))
            n = len(started)
            conn.execute(
                Q["finish"],
                {"worker": worker, "ids": [r[0] for r in started], "attempts": [r[1] for r in started],
                 "statuses": ["completed"] * n, "outcomes": ["completed"] * n, "delays": [None] * n,
                 "results": [Jsonb({})] * n, "errors": [None] * n},
            )  # fmt: skip
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--n", type=int, default=40_000, help="executions per measurement (batch 500)")
    parser.add_argument("--lanes", type=int, default=2, help=f"sessions ({os.cpu_count()} cores here)")
    parser.add_argument("--batch", default="500,10,2")
    parser.add_argument("--latency-n", type=int, default=500, help="executions timed for the latency floor")
    args = parser.parse_args()
    name = f"conveyor_bench_floor_{os.getpid()}"
    url = fresh_database(args.url, name)
    try:
        print(f"# bench/floor.py  {platform.node()}  cpus={os.cpu_count()}  python {sys.version.split()[0]}")
        print("# server:", "  ".join(f"{k}={v}" for k, v in server_settings(url).items()))
        print(f"# lanes={args.lanes}  n={args.n} at batch 500, n/50*batch below it")
        for what, tps, ms in reference(args.url, 5):
            print(f"reference  {what:<22} {tps:>9,.0f} tps  {ms:.2f} ms")
        with connect(url) as conn:
            workers = setup(conn, args.lanes)
            conn.execute(LEAN)
        for batch in (int(b) for b in args.batch.split(",")):
            n = args.n if batch >= 500 else max(args.lanes * batch, args.n * batch // 500 * 10)
            for label, fn in (("conveyor", conveyor_lane), ("lean queue", lean_lane)):
                per_s, cpu_ms = run(url, fn, workers, n, batch)
                print(
                    f"batch {batch:>4}  {label:<11} {per_s:>9,.0f} executions/s"
                    f"   PostgreSQL CPU {cpu_ms:.3f} ms/execution  (n={n})"
                )
                with connect(url) as conn:
                    conn.execute("TRUNCATE execution CASCADE")
                    conn.execute("TRUNCATE lean")
                    conn.execute("VACUUM ANALYZE")
        lat = latency_floor(url, workers[0], args.latency_n)
        print(
            f"latency floor (request commit -> start commit, nothing between the statements): "
            f"p50 {pct(lat, 50):.2f} ms  p99 {pct(lat, 99):.2f} ms  (n={len(lat)})"
        )
    finally:
        drop_database(args.url, name)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
