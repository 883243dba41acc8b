"""Recovery benchmark (not a test): how soon a running execution starts again on another
worker after its worker dies or is cut off.

    python bench/recovery.py [--url postgresql://postgres@127.0.0.1/postgres] [--runs 20] [--cut-runs 3]
                             [--heartbeat-interval 10] [--skip-kill] [--skip-cut]

Starts one `conveyor executor` and a standby `conveyor worker` (B) as real processes
against a fresh database on an already-running PostgreSQL, with the product's default
settings unless --heartbeat-interval is given, then:

  1. SIGKILL (--runs times): worker A is started, runs core.sleep seconds=30 (B is
     cordoned meanwhile, so it starts on A), B is uncordoned and A gets SIGKILL. Measured:
     from the kill (database clock, read right after os.kill) to the next attempt's
     `started` (database clock). The kernel closes A's sockets, its liveness lock goes
     with its session; a sweep notes the lock missing and the first sweep after
     worker.lock_grace declares A dead: expected well under a second.
  2. Cut link (--cut-runs times, needs root and `ip netns`): worker A runs in its own
     network namespace and reaches PostgreSQL over a veth pair and a TCP forwarder
     (tests/acceptance/netns.py, loaded by path); the link is set down while A runs the
     execution. Measured: from the cut to the next attempt's `started`. Expected: the
     threshold (heartbeat_interval x 3, 30 s by default) after A's last heartbeat, which
     was at most one interval before the cut, plus at most one sweep -- at most
     threshold + sweep (31 s). Also shown: when A fenced itself (stopped its copy) and
     why the executor declared it dead.

Every process, the namespace and the veth pair are removed at exit, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from conveyor.config import ExecutorSettings, RecoverySettings, WorkerSettings
from conveyor.sdk import Client, request_execution

sys.path.insert(0, str(Path(__file__).parent))
from core import fresh_database

SCHEMA = "conveyor"
DATABASE = "conveyor_bench_recovery"
ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def load_netns() -> ModuleType:
    """tests/acceptance/netns.py (stdlib only), shared with the partition test."""
    path = ROOT / "tests" / "acceptance" / "netns.py"
    spec = importlib.util.spec_from_file_location("conveyor_bench_netns", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row, options=f"-c search_path={SCHEMA}")


def wait_until(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(interval)


class Fleet:
    """The processes of a run, with their logs in one directory; all killed at exit."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, role: list[str], prefix: tuple[str, ...] = (), **env: str) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "conveyor", *role],
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def db_now(conn: psycopg.Connection[dict[str, Any]]) -> datetime:
    row = conn.execute("SELECT clock_timestamp() AS t").fetchone()
    assert row is not None
    return row["t"]  # type: ignore[no-any-return]


def worker_row(conn: psycopg.Connection[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return conn.execute("SELECT id, status, pid FROM worker WHERE name = %s", (name,)).fetchone()


def registered(conn: psycopg.Connection[dict[str, Any]], name: str, pid: int) -> dict[str, Any] | None:
    row = worker_row(conn, name)
    return row if row and row["status"] == "active" and row["pid"] == pid else None


def start_on(conn: psycopg.Connection[dict[str, Any]], client: Client, worker_id: int, seconds: float) -> int:
    """Request core.sleep while the standby is cordoned, so it starts on ``worker_id``."""
    client.cordon("bench-b")
    try:
        with conn.transaction():
            eid = request_execution(conn, "core.sleep", {"seconds": seconds}, schema=SCHEMA)

        def running() -> bool:
            row = conn.execute("SELECT status, worker FROM execution WHERE id = %s", (eid,)).fetchone()
            return bool(row and row["status"] == "running" and row["worker"] == worker_id)

        wait_until(f"execution {eid} running on worker {worker_id}", running, timeout=60)
    finally:
        client.cordon("bench-b", cordoned=False)
    return eid


def next_attempt_started(conn: psycopg.Connection[dict[str, Any]], eid: int, timeout: float) -> datetime:
    def started() -> datetime | None:
        row = conn.execute(
            "SELECT started FROM execution_attempt WHERE execution = %s AND attempt = 2", (eid,)
        ).fetchone()
        return row["started"] if row else None

    return wait_until(f"execution {eid}'s second attempt to start", started, timeout=timeout, interval=0.005)


def handover(conn: psycopg.Connection[dict[str, Any]], eid: int) -> tuple[datetime, datetime]:
    """When the lost attempt was closed (the sweep's transaction) and the next one placed."""
    row = conn.execute(
        "SELECT (SELECT ended FROM execution_attempt WHERE execution = %(e)s AND attempt = 1) AS ended,"
        " (SELECT scheduled FROM execution_attempt WHERE execution = %(e)s AND attempt = 2) AS placed",
        {"e": eid},
    ).fetchone()
    if row is None or row["ended"] is None or row["placed"] is None:
        raise SystemExit(f"execution {eid}: first attempt not closed or second not placed")
    return row["ended"], row["placed"]


def reference(url: str, n: int = 500) -> dict[str, float]:
    """Measured in the same run, so a slow machine shows as such: the round trip of
    SELECT 1, and of the query an executor's watch asks every recovery.watch_interval
    (its cost per replica), each p50 over ``n`` runs, in ms."""
    from conveyor.store.queries import Q

    out = {"watch query": float("nan")}  # no watch before migration 0022 (a baseline run)
    queries = {"select 1": "SELECT 1", "watch query": Q.get("liveness_missing")}
    with connect(url) as conn:
        for name, query in queries.items():
            if query is None:
                continue
            times = []
            for _ in range(n):
                t = time.perf_counter()
                conn.execute(query).fetchone()
                times.append((time.perf_counter() - t) * 1000)
            out[name] = statistics.median(times)
    return out


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z) ")


def logged_at(text: str, needle: str, after: datetime) -> tuple[datetime, str] | None:
    """The first log line (structlog console format) containing ``needle`` after ``after``."""
    for line in text.splitlines():
        m = _STAMP.match(line)
        if m and needle in line:
            at = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
            if at >= after:
                return at, line
    return None


def pct(values: list[float], p: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


# -- 1. SIGKILL ------------------------------------------------------------------------------


def kill_runs(url: str, fleet: Fleet, runs: int, threshold: float) -> list[tuple[float, float, float]]:
    """Per run, from the kill to: the new attempt started, the lost attempt closed, the new
    attempt placed on B (seconds)."""
    figures = []
    with connect(url) as conn, Client(url, SCHEMA) as client:
        for i in range(runs):
            a = fleet.start("a", ["worker", "--name", "bench-a"])
            row = wait_until("worker A registered", lambda a=a: registered(conn, "bench-a", a.pid), timeout=60)
            eid = start_on(conn, client, row["id"], seconds=30)
            # Let it settle into its sleep; a random phase against the executors' sweeps.
            time.sleep(0.2 + random.random())
            os.kill(a.pid, signal.SIGKILL)
            killed = db_now(conn)
            started = next_attempt_started(conn, eid, timeout=threshold + 60)
            a.wait(10)
            figure = (started - killed).total_seconds()
            ended, placed = handover(conn, eid)
            detected, scheduled = (ended - killed).total_seconds(), (placed - killed).total_seconds()
            figures.append((figure, detected, scheduled))
            print(
                f"  SIGKILL run {i + 1}/{runs}: next attempt started {figure * 1000:.0f} ms after the kill "
                f"(lost attempt closed after {detected * 1000:.0f} ms, next placed after {scheduled * 1000:.0f} ms)",
                flush=True,
            )
    return figures


# -- 2. cut link ------------------------------------------------------------------------------


def cut_runs(
    url: str, fleet: Fleet, runs: int, heartbeat: float, threshold: float, netns: ModuleType
) -> list[dict[str, Any]]:
    target = psycopg.conninfo.conninfo_to_dict(url)
    host = str(target.get("host") or "127.0.0.1")
    if host.startswith("/"):
        raise SystemExit("the cut-link runs need PostgreSQL on TCP (the forwarder connects to it), not a unix socket")
    results = []
    with contextlib.ExitStack() as stack:
        veth = stack.enter_context(netns.VethNamespace())
        keepalive = netns.liveness_keepalive(heartbeat)
        forwarder = stack.enter_context(
            netns.Forwarder(veth.host_addr, (host, int(target.get("port") or 5432)), keepalive)
        )
        ns_url = psycopg.conninfo.make_conninfo(url, host=forwarder.host, port=str(forwarder.port))
        a = fleet.start(
            "a-netns", ["worker", "--name", "bench-a-netns"], prefix=tuple(veth.command()), DATABASE_URL=ns_url
        )
        stack.callback(fleet.close)  # the namespaced worker goes before its namespace
        with connect(url) as conn, Client(url, SCHEMA) as client:
            for i in range(runs):
                row = wait_until(
                    "worker A (in its namespace) active",
                    lambda: registered(conn, "bench-a-netns", a.pid),
                    timeout=threshold + 60,
                    interval=0.2,
                )
                eid = start_on(conn, client, row["id"], seconds=threshold * 3 + 30)
                # A random phase against A's heartbeats (it just beat when it registered).
                time.sleep(0.2 + random.random() * heartbeat)
                veth.cut()
                cut = db_now(conn)
                try:
                    started = next_attempt_started(conn, eid, timeout=threshold + 60)
                finally:
                    veth.restore()
                figure = (started - cut).total_seconds()
                fenced = logged_at(fleet.log("a-netns"), "worker lost its standing", cut)
                declared = logged_at(fleet.log("executor"), "Worker bench-a-netns", cut)
                reason = "?"
                if declared:
                    m = re.search(r"\) (.*?), marking as inactive", declared[1])
                    reason = m.group(1) if m else declared[1]
                result = {
                    "recovered": figure,
                    "fenced": (fenced[0] - cut).total_seconds() if fenced else None,
                    "reason": reason,
                }
                results.append(result)
                fence = f"{result['fenced']:.1f} s" if result["fenced"] is not None else "not seen"
                print(
                    f"  cut run {i + 1}/{runs}: next attempt started {figure:.2f} s after the cut; "
                    f"A fenced itself after {fence}; executor: {reason}",
                    flush=True,
                )
                # Link back: A must rejoin before the next run.
                wait_until(
                    "worker A rejoined after the link came back",
                    lambda: registered(conn, "bench-a-netns", a.pid),
                    timeout=threshold + 60,
                    interval=0.2,
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    )
    parser.add_argument("--runs", type=int, default=20, help="SIGKILL runs")
    parser.add_argument("--cut-runs", type=int, default=3, help="cut-link runs (each takes about the threshold)")
    parser.add_argument(
        "--heartbeat-interval", type=float, default=None, help="worker.heartbeat_interval (default: the product's)"
    )
    parser.add_argument("--skip-kill", action="store_true", help="no SIGKILL runs")
    parser.add_argument("--skip-cut", action="store_true", help="no cut-link runs")
    args = parser.parse_args()

    netns = load_netns()
    problem = None if args.skip_cut else netns.netns_problem()
    if problem:
        raise SystemExit(f"cut-link runs impossible: {problem} (use --skip-cut)")

    overrides = {}
    if args.heartbeat_interval is not None:
        overrides["CONVEYOR__WORKER__HEARTBEAT_INTERVAL"] = str(args.heartbeat_interval)
    # The settings the processes will run with: defaults plus the overrides above.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR") and k != "DATABASE_URL"}
    env.update(overrides)
    worker_cfg = WorkerSettings(**({"heartbeat_interval": args.heartbeat_interval} if overrides else {}))
    recovery_cfg, executor_cfg = RecoverySettings(), ExecutorSettings()
    heartbeat = worker_cfg.heartbeat_interval
    threshold = worker_cfg.staleness
    sweep = recovery_cfg.sweep_interval
    watch = getattr(recovery_cfg, "watch_interval", "-")  # "-": a baseline run, before the watch

    url = fresh_database(args.url, DATABASE)
    with connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        server_version = row["server_version"] if row else "?"
    env["DATABASE_URL"] = url
    logdir = Path(tempfile.mkdtemp(prefix="conveyor-bench-recovery-"))
    fleet = Fleet(env, logdir)
    kills: list[tuple[float, float, float]] = []
    cuts: list[dict[str, Any]] = []
    try:
        fleet.start("executor", ["executor"])
        b = fleet.start("b", ["worker", "--name", "bench-b"], CONVEYOR__WORKER__MAX_CONCURRENT_TASKS="64")
        with connect(url) as conn:
            wait_until("worker B registered", lambda: registered(conn, "bench-b", b.pid), timeout=60)
        if not args.skip_kill:
            kills = kill_runs(url, fleet, args.runs, threshold)
        if not args.skip_cut:
            cuts = cut_runs(url, fleet, args.cut_runs, heartbeat, threshold, netns)
        ref = reference(url)
    finally:
        fleet.close()
        with contextlib.suppress(psycopg.Error), psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))

    print("Conveyor recovery benchmark")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"  postgres: {server_version} at {args.url}")
    print(
        f"  settings: worker.heartbeat_interval={heartbeat:g}"
        f"{'' if overrides else ' (default)'}, heartbeat_staleness_multiplier="
        f"{worker_cfg.heartbeat_staleness_multiplier:g} -> threshold {threshold:g} s, "
        f"self_fence_after {worker_cfg.self_fence_after:g} s, lock_grace {worker_cfg.lock_grace:g} s; "
        f"recovery.sweep_interval={sweep:g} s, recovery.watch_interval={watch} s, "
        f"executor.poll_interval={executor_cfg.poll_interval:g} s, "
        f"worker.poll_interval={worker_cfg.poll_interval:g} s (defaults)"
    )
    print("  processes: 1 executor, standby worker B, worker A (restarted for each SIGKILL run)")
    print(
        f"  reference (same run, p50 of 500 round trips on one connection): SELECT 1 {ref['select 1']:.2f} ms, "
        f"the watch query {ref['watch query']:.2f} ms (asked by each executor every "
        f"{watch} s)"
    )
    if kills:
        for label, values in (
            ("SIGKILL -> next attempt started", [k[0] for k in kills]),
            ("  of which detection (kill -> lost attempt closed)", [k[1] for k in kills]),
            ("  then placement (lost attempt closed -> next placed on B)", [k[2] - k[1] for k in kills]),
            ("  then start (placed -> started on B)", [k[0] - k[2] for k in kills]),
        ):
            ms = sorted(v * 1000 for v in values)
            print(
                f"{label} ({len(ms)} runs, database clock): p50 {pct(ms, 50):.0f} ms, p95 {pct(ms, 95):.0f} ms, "
                f"p99 {pct(ms, 99):.0f} ms, max {ms[-1]:.0f} ms"
            )
        print(f"  each (ms): {', '.join(f'{k[0] * 1000:.0f}' for k in kills)}")
    if cuts:
        bound = threshold + sweep
        print(
            f"cut link -> next attempt started ({len(cuts)} runs), vs threshold ({threshold:g} s) + one sweep "
            f"({sweep:g} s) = {bound:g} s (lower bound: threshold - one interval = {threshold - heartbeat:g} s):"
        )
        for i, c in enumerate(cuts, 1):
            fence = f"{c['fenced']:.2f} s" if c["fenced"] is not None else "not seen"
            verdict = "within" if c["recovered"] <= bound else "OVER"
            print(
                f"  run {i}: {c['recovered']:.2f} s ({verdict} {bound:g} s); A stopped its copy after {fence}; "
                f"executor: {c['reason']}"
            )
    print(f"  logs: {logdir}")


if __name__ == "__main__":
    main()
