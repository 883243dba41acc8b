"""Helpers of the benchmarks (bench/core.py, history.py, workflows.py, ...): scratch
databases, processes, /proc readings, the reference, the core.noop throughput and
latency loops.

Nothing here decides what is measured; the scripts do, with these."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from conveyor.sdk import request_executions
from conveyor.service.app import prepare_database

SCHEMA = "conveyor"
TERMINAL = ("completed", "failed", "timeout", "cancelled", "abandoned")
Conn = psycopg.Connection[Any]


def fresh_database(server_url: str, name: str, *, migrate: bool = True) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    if migrate:
        prepare_database(url, SCHEMA)
    return url


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def connect(url: str) -> Conn:
    """An autocommit session on ``url`` with Conveyor's schema on its search path."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"SET search_path TO {SCHEMA}")
    return conn


def conveyor_env(url: str, **settings: object) -> dict[str, str]:
    """The environment of a ``conveyor`` process on ``url``, logging at warning: each
    ``section__name=value`` becomes ``CONVEYOR__SECTION__NAME`` (``transport="postgres"``
    becomes ``CONVEYOR__TRANSPORT``)."""
    env = {**os.environ, "DATABASE_URL": url, "CONVEYOR__LOG__LEVEL": "warning"}
    return env | {f"CONVEYOR__{key.upper()}": str(value) for key, value in settings.items()}


def start(role: str, env: dict[str, str], logdir: Path) -> subprocess.Popen[bytes]:
    log = open(logdir / f"{role}.log", "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen([sys.executable, "-m", "conveyor", role], env=env, stdout=log, stderr=log)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for(conn: Conn, query: str, done: object, timeout: float, interval: float = 0.1) -> None:
    # The figures come from the database clock (max(ended)), not from when this loop
    # notices: polling faster gains nothing and takes CPU from the run it measures (a
    # count over the run's rows every 10 ms was 6% of the database's time at c=2).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(query).fetchone()
        if row and row[0] == done:
            return
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for: {query}")


def finished(after: int = 0) -> str:
    """How many executions past id ``after`` have ended (for ``wait_for``); counted on the
    primary key range of a run's rows, never over a history the run did not write."""
    return f"SELECT count(*) FROM execution WHERE id > {after} AND status IN {TERMINAL}"


def enqueue_noops(conn: Conn, n: int, batch: int) -> Any:
    """Request ``n`` core.noop in one transaction, ``batch`` rows a statement; returns the
    database clock just after its commit (where a throughput run starts)."""
    with conn.transaction():
        for begin in range(0, n, batch):
            request_executions(conn, [("core.noop", {})] * min(batch, n - begin))
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row
    return row[0]


def ended_since(conn: Conn, t0: Any, after: int = 0) -> tuple[float, int]:
    """(seconds from ``t0`` to the last execution past id ``after`` ended, how many of
    those completed)."""
    row = conn.execute(
        "SELECT extract(epoch FROM max(ended) - %s), count(*) FILTER (WHERE status = 'completed')"
        " FROM execution WHERE id > %s",
        (t0, after),
    ).fetchone()
    assert row
    return float(row[0]), int(row[1])


def paced_latency(conn: Conn, rate: float, total: int, after: int = 0) -> list[float]:
    """Request ``total`` core.noop one at a time at ``rate``/s, each its own commit; once
    all have ended, their started - created in ms (database clock), sorted."""
    begin = time.monotonic()
    for i in range(total):
        delay = begin + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        conn.execute("SELECT request_execution('core.noop', '{}')")
    wait_for(conn, finished(after), total, timeout=120)
    rows = conn.execute(
        "SELECT extract(epoch FROM started - created) * 1000 FROM execution WHERE id > %s AND started IS NOT NULL",
        (after,),
    ).fetchall()
    return sorted(float(r[0]) for r in rows)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MB."""
    match = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(match.group(1)) / 1024 if match else float("nan")


def commits(conn: Conn) -> int:
    row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def pct(values: list[float], p: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


# autovacuum: the development machine's shared server runs with it off, which changes what a
# long run measures (no cleaning of the live indexes, no automatic ANALYZE): print it.
SETTINGS = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "commit_delay",
            "autovacuum")  # fmt: skip


def server_settings(url: str, names: tuple[str, ...] = SETTINGS) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return {n: str(conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(n))).fetchone()[0]) for n in names}  # type: ignore[index]


def reference(server_url: str, seconds: float) -> list[tuple[str, float, float]]:
    """(what, tps, ms per transaction): pgbench -N (simple-update, one durable commit per
    transaction) at 1 and 2 clients on a scratch database, or without pgbench a loop of
    single-row UPDATE commits on one connection."""
    name = f"conveyor_bench_ref_{os.getpid()}"
    url = fresh_database(server_url, name, migrate=False)
    out: list[tuple[str, float, float]] = []
    try:
        pgbench = shutil.which("pgbench")
        if pgbench:
            info = psycopg.conninfo.conninfo_to_dict(url)
            args = [pgbench, "-h", str(info.get("host", "127.0.0.1")), "-p", str(info.get("port", 5432)),
                    "-U", str(info.get("user", "postgres"))]  # fmt: skip
            subprocess.run([*args, "-i", "-q", "-s", "1", name], check=True, capture_output=True)
            for clients in (1, 2):
                bench = [*args, "-N", "-c", str(clients), "-j", str(clients), "-T", str(max(1, round(seconds))), name]
                run = subprocess.run(bench, check=True, capture_output=True, text=True)
                tps = float(re.search(r"tps = ([\d.]+)", run.stdout).group(1))  # type: ignore[union-attr]
                lat = float(re.search(r"latency average = ([\d.]+) ms", run.stdout).group(1))  # type: ignore[union-attr]
                out.append((f"pgbench -N -c {clients}", tps, lat))
        else:
            with psycopg.connect(url, autocommit=True) as conn:
                tps = update_rate(conn, "t", seconds)
                out.append(("single-row UPDATE loop", tps, 1000 / tps))
    finally:
        drop_database(server_url, name)
    return out


def update_rate(conn: Conn, table: str, seconds: float) -> float:
    """Statements/s of a one-row autocommit UPDATE loop on ``table`` (created or emptied
    first), each a durable commit: a reference that touches nothing of Conveyor's."""
    ident = sql.Identifier(*table.split("."))
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (n bigint)").format(ident))
    conn.execute(sql.SQL("TRUNCATE {}").format(ident))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (0)").format(ident))
    update = sql.SQL("UPDATE {} SET n = n + 1").format(ident)
    count, begin = 0, time.monotonic()
    while time.monotonic() - begin < seconds:
        conn.execute(update)
        count += 1
    return count / (time.monotonic() - begin)


def delete_broker_objects(amqp_url: str, prefix: str, worker_ids: list[int]) -> None:
    import asyncio

    import aio_pika

    async def clean() -> None:
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            queues = [f"{prefix}.executor.requests", f"{prefix}.dlx.queue"]
            queues += [f"{prefix}.worker.{w}.executions" for w in worker_ids]
            for queue in queues:
                await channel.queue_delete(queue)
            for exchange in (f"{prefix}.executions", f"{prefix}.events", f"{prefix}.dlx"):
                await channel.exchange_delete(exchange)

    asyncio.run(clean())
