"""Workflow benchmark (not a test): step latency, ``with`` fan-out, many workflows at once.

    python bench/workflows.py [--transport postgres|rabbitmq|both] [--workers 1] [--concurrency 500]
                              [--latency-workflows 30] [--steps 10] [--items 10000] [--item-concurrency 500]
                              [--workflows 1000] [--workflow-steps 3]

(run from a checkout with ``PYTHONPATH=src``). Starts one ``conveyor executor`` and
``--workers`` ``conveyor worker`` processes against a fresh database on an
already-running PostgreSQL (as bench/core.py does), registers the workflows below, then:

  0. reference: ``--items`` plain core.noop executions enqueued in one transaction, from
     that commit to the last one ended (the same processes, in the same run): the no-op
     throughput the fan-out is compared with;
  a. step latency: ``--latency-workflows`` workflows of ``--steps`` sequential core.noop
     tasks, one at a time; each sample is child k's ``ended`` to child k+1's ``created``
     (both database clock): a child's terminal transition to the next child requested,
     i.e. the event, the wake-up and the advancement. Target p50 <= 5 ms;
  b. fan-out: one workflow whose single task runs core.noop ``with`` ``--items`` items at
     concurrency ``--item-concurrency``; items/s from the workflow execution's
     ``created`` to its ``ended``. Target >= half the reference;
  c. ``--workflows`` workflows of ``--workflow-steps`` sequential core.noop tasks requested
     in one transaction: from that commit to the last workflow ended, workflows/s, and
     every one must have completed.

Figures come from the database clock (execution.created/started/ended). Prints them with
every setting they came from; the executor's and workers' logs are kept (path on stderr).

Profiling: ``BENCH_PROBE=/path/script.py`` runs that script instead of
``python -m conveyor executor`` (same environment), e.g. one that starts cProfile and then
``runpy.run_module("conveyor", run_name="__main__")`` with ``sys.argv = ["conveyor", "executor"]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.workflows.spec import TaskSpec, Transition, WithItems, WorkflowSpec

sys.path.insert(0, str(Path(__file__).parent))
from core_kit import (
    TERMINAL,
    Conn,
    connect,
    conveyor_env,
    delete_broker_objects,
    ended_since,
    enqueue_noops,
    finished,
    fresh_database,
    pct,
    server_settings,
    stop,
    wait_for,
)

DATABASE = "conveyor_bench_workflows"


def sequence(ref: str, steps: int) -> WorkflowSpec:
    """t0 -> t1 -> ... each core.noop, on success."""
    tasks = {}
    for i in range(steps):
        nxt = (Transition(when="<% succeeded() %>", do=(f"t{i + 1}",)),) if i + 1 < steps else ()
        tasks[f"t{i}"] = TaskSpec(name=f"t{i}", action="core.noop", next=nxt)
    return WorkflowSpec(ref=ref, tasks=tasks)


def fan_out(ref: str) -> WorkflowSpec:
    """One task: core.noop for each of range(n) items, at most c at once."""
    each = WithItems(items="<% range(ctx(n)) %>", concurrency="<% ctx(c) %>")
    return WorkflowSpec(ref=ref, tasks={"each": TaskSpec(name="each", action="core.noop", with_items=each)})


def register(conn: Conn, spec: WorkflowSpec) -> None:
    conn.execute("SELECT register_workflow(%s, %s)", (spec.ref, Jsonb(spec.to_json())))


def db_now(conn: Conn) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row
    return row[0]


def reference(url: str, n: int) -> float:
    """Plain core.noop throughput: n enqueued in one commit -> last ended."""
    with connect(url) as conn:
        t0 = enqueue_noops(conn, n, batch=n)
        wait_for(conn, finished(), n, timeout=600)
        elapsed, completed = ended_since(conn, t0)
        conn.execute("TRUNCATE execution CASCADE")
    if completed != n:
        raise SystemExit(f"reference: only {completed} of {n} completed")
    return n / elapsed


def ended(conn: Conn, eid: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone()
        if row and row[0] in TERMINAL:
            return str(row[0])
        time.sleep(0.005)
    raise SystemExit(f"timed out waiting for workflow execution {eid}")


def request(conn: Conn, ref: str, parameters: dict[str, Any] | None = None) -> int:
    row = conn.execute("SELECT request_execution(%s, %s)", (ref, Jsonb(parameters or {}))).fetchone()
    assert row
    return int(row[0])


def step_latency(url: str, workflows: int, steps: int) -> list[float]:
    """ended(child k) -> created(child k+1), ms, over sequential workflows run one at a time."""
    samples: list[float] = []
    with connect(url) as conn:
        for _ in range(workflows):
            eid = request(conn, "bench.seq")
            status = ended(conn, eid, timeout=60)
            if status != "completed":
                raise SystemExit(f"latency: workflow {eid} {status}")
            rows = conn.execute(
                "SELECT extract(epoch FROM created - lag(ended) OVER (ORDER BY id)) * 1000"
                " FROM execution WHERE parent = %s ORDER BY id",
                (eid,),
            ).fetchall()
            if len(rows) != steps:
                raise SystemExit(f"latency: workflow {eid} has {len(rows)} children, expected {steps}")
            samples += [float(r[0]) for r in rows[1:]]
        conn.execute("TRUNCATE execution CASCADE")
    return sorted(samples)


def fan_out_run(url: str, items: int, concurrency: int) -> tuple[float, float, float]:
    """(items/s over the workflow's created -> ended, seconds, max children running at once)."""
    with connect(url) as conn:
        eid = request(conn, "bench.fanout", {"n": items, "c": concurrency})
        status = ended(conn, eid, timeout=1800)
        row = conn.execute(
            "SELECT extract(epoch FROM ended - created), result FROM execution WHERE id = %s", (eid,)
        ).fetchone()
        assert row
        if status != "completed":
            raise SystemExit(f"fan-out: workflow {eid} {status}: {str(row[1])[:500]}")
        counts = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'completed') FROM execution WHERE parent = %s", (eid,)
        ).fetchone()
        assert counts
        if counts != (items, items):
            raise SystemExit(f"fan-out: {counts[1]} of {counts[0]} children completed, expected {items}")
        # The most children running at once (started..ended intervals): the limit held?
        peak = conn.execute(
            "SELECT max(n) FROM (SELECT sum(d) OVER (ORDER BY t, d) AS n FROM ("
            " SELECT started AS t, 1 AS d FROM execution WHERE parent = %(p)s"
            " UNION ALL SELECT ended, -1 FROM execution WHERE parent = %(p)s) x) y",
            {"p": eid},
        ).fetchone()
        assert peak
        conn.execute("TRUNCATE execution CASCADE")
    seconds = float(row[0])
    return items / seconds, seconds, float(peak[0])


def many(url: str, workflows: int) -> tuple[float, float, int]:
    """(workflows/s, seconds, completed) for ``workflows`` requested in one commit."""
    with connect(url) as conn:
        with conn.transaction():
            ids = [
                int(r[0])
                for r in conn.execute(
                    "SELECT request_execution('bench.many', '{}') FROM generate_series(1, %s)", (workflows,)
                ).fetchall()
            ]
        t0 = db_now(conn)
        wait_for(conn, f"SELECT count(*) FROM execution WHERE parent IS NULL AND status IN {TERMINAL}", workflows,
                 timeout=1800)  # fmt: skip
        row = conn.execute(
            "SELECT extract(epoch FROM max(ended) - %s), count(*) FILTER (WHERE status = 'completed')"
            " FROM execution WHERE id = ANY(%s)",
            (t0, ids),
        ).fetchone()
        assert row
        conn.execute("TRUNCATE execution CASCADE")
    seconds = float(row[0])
    return workflows / seconds, seconds, int(row[1])


def start(name: str, role: str, env: dict[str, str], logdir: Path) -> subprocess.Popen[bytes]:
    log = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
    argv = [sys.executable, "-m", "conveyor", role]
    if role == "executor" and os.environ.get("BENCH_PROBE"):
        argv = [sys.executable, os.environ["BENCH_PROBE"]]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=log)


def run_once(args: argparse.Namespace, transport: str) -> dict[str, Any]:
    url = fresh_database(args.url, DATABASE)
    with connect(url) as conn:
        register(conn, sequence("bench.seq", args.steps))
        register(conn, sequence("bench.many", args.workflow_steps))
        register(conn, fan_out("bench.fanout"))
    env = conveyor_env(
        url,
        transport=transport,
        executor__batch_size=args.batch_size,
        workflow__batch_size=args.workflow_batch_size,
        worker__max_concurrent_tasks=args.concurrency,
    )
    prefix = f"benchwf{os.getpid()}"
    if transport == "rabbitmq":
        env |= {"CONVEYOR__MESSAGE_QUEUE__URL": args.amqp_url, "CONVEYOR__MESSAGE_QUEUE__PREFIX": prefix}
    logdir = Path(tempfile.mkdtemp(prefix=f"conveyor-bench-workflows-{transport}-"))
    procs = [start("executor", "executor", env, logdir)]
    for i in range(args.workers):
        procs.append(start(f"worker{i + 1}", "worker", env | {"CONVEYOR__WORKER__NAME": f"bench-worker-{i + 1}"},
                           logdir))  # fmt: skip
    out: dict[str, Any] = {}
    try:
        with connect(url) as conn:
            wait_for(conn, "SELECT count(*) FROM worker WHERE status = 'active'", args.workers, timeout=30)
        reference(url, 500)  # warm-up
        sequence_warmup = step_latency(url, 2, args.steps)  # warm-up (imports, caches)
        del sequence_warmup
        if "reference" in args.only or "fanout" in args.only:
            out["reference"] = reference(url, args.items)
        if "latency" in args.only:
            out["latency"] = step_latency(url, args.latency_workflows, args.steps)
        if "fanout" in args.only:
            out["fanout"] = fan_out_run(url, args.items, args.item_concurrency)
        if "many" in args.only:
            out["many"] = many(url, args.workflows)
    finally:
        stop(procs)
        if transport == "rabbitmq":
            # The workers registered in a fresh database: ids 1..workers.
            delete_broker_objects(args.amqp_url, prefix, worker_ids=list(range(1, args.workers + 1)))
    print(f"  {transport} logs: {logdir}", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--transport", choices=["postgres", "rabbitmq", "both"], default="postgres")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=500, help="worker.max_concurrent_tasks")
    parser.add_argument("--batch-size", type=int, default=500, help="executor.batch_size")
    parser.add_argument("--workflow-batch-size", type=int, default=50, help="workflow.batch_size")
    parser.add_argument("--latency-workflows", type=int, default=30, help="sequential workflows in (a)")
    parser.add_argument("--steps", type=int, default=10, help="tasks per workflow in (a)")
    parser.add_argument("--items", type=int, default=10_000, help="items of the with in (b), and reference size")
    parser.add_argument("--item-concurrency", type=int, default=500, help="with concurrency in (b)")
    parser.add_argument("--workflows", type=int, default=1_000, help="workflows at once in (c)")
    parser.add_argument("--workflow-steps", type=int, default=3, help="tasks per workflow in (c)")
    parser.add_argument("--only", nargs="+", default=["reference", "latency", "fanout", "many"],
                        choices=["reference", "latency", "fanout", "many"], help="parts to run")  # fmt: skip
    args = parser.parse_args()

    settings = server_settings(args.url, ("server_version", "fsync", "synchronous_commit", "shared_buffers"))
    transports = ["postgres", "rabbitmq"] if args.transport == "both" else [args.transport]
    results = {t: run_once(args, t) for t in transports}

    print("Conveyor workflow benchmark")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("  postgres: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(
        f"  processes: 1 executor + {args.workers} worker(s), executor.batch_size={args.batch_size}, "
        f"workflow.batch_size={args.workflow_batch_size}, worker.max_concurrent_tasks={args.concurrency}"
    )
    print(f"  reference: {args.items} plain core.noop in one commit -> last ended (database clock)")
    print(f"  (a) {args.latency_workflows} x {args.steps}-step sequential core.noop workflows, one at a time: "
          "child k ended -> child k+1 created")  # fmt: skip
    print(f"  (b) one with over {args.items} core.noop items at concurrency {args.item_concurrency}: "
          "workflow created -> ended")  # fmt: skip
    print(f"  (c) {args.workflows} x {args.workflow_steps}-step sequential workflows in one commit -> last ended")
    for transport, r in results.items():
        print(f"[{transport}]")
        ref = r.get("reference")
        if ref is not None:
            print(f"  reference      {ref:>10,.0f} executions/s")
        if "latency" in r:
            lat = r["latency"]
            print(f"  (a) step ms    p50 {pct(lat, 50):.2f}  p90 {pct(lat, 90):.2f}  p99 {pct(lat, 99):.2f}  "
                  f"max {lat[-1]:.2f}  ({len(lat)} samples)  target p50 <= 5 ms: "
                  f"{'met' if pct(lat, 50) <= 5 else 'MISSED'}")  # fmt: skip
        if "fanout" in r:
            rate, seconds, peak = r["fanout"]
            verdict = f"{rate / ref:.2f} of reference, target >= 0.5: {'met' if rate >= ref / 2 else 'MISSED'}"
            print(f"  (b) fan-out    {rate:>10,.0f} items/s  ({seconds:.2f} s, peak running {peak:.0f})  {verdict}")
        if "many" in r:
            rate, seconds, completed = r["many"]
            print(f"  (c) at once    {rate:>10,.1f} workflows/s  ({seconds:.2f} s, {completed} of "
                  f"{args.workflows} completed)")  # fmt: skip


if __name__ == "__main__":
    main()
