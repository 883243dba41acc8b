"""Time to recover after each fault, from the database's record and the processes' logs.

- A killed **worker** strands the executions it had (scheduled or running). *Recovered*:
  every one of them is running again (an attempt started after the kill, on any worker,
  the restarted one included) or has ended. *Detected*: the sweep closed its running
  attempts ``worker_lost``. *Rejoined*: the restarted process logged ``worker registered``.
- A killed **executor** strands its claims (``scheduling``). *Recovered*: each was
  dispatched again (an attempt scheduled after the kill) or ended. *Rejoined*: its
  restart logged ``executor started``.
- **PostgreSQL** restart: *back* when ``pg_ctl restart`` returned; *recovered* at the
  first execution that ended after that (throughput resumed).
- **RabbitMQ** restart (``stop_app``, ``start_app``, ``await_startup``): *recovered*
  when every process that lived through it had logged ``connected to RabbitMQ`` again,
  and when the outbox was back to its depth of the 10 s before the restart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from .faults import Fault, Sample
from .fleet import Fleet, log_times

Conn = psycopg.Connection[dict[str, Any]]


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _after(at: float, value: float | None) -> str:
    return f"{value - at:6.2f}s" if value is not None else "   -   "


def describe(conn: Conn, faults: list[Fault], fleet: Fleet, samples: list[Sample], began: float) -> list[str]:
    lines = []
    by_pid = fleet.by_pid()
    for f in sorted(faults, key=lambda f: f.at):
        head = f"  t+{f.at - began:6.1f}s  {f.kind:<32} {f.target:<10}"
        if f.role == "worker":
            lines.append(head + _worker(conn, f, by_pid))
        elif f.role == "executor":
            lines.append(head + _executor(conn, f, by_pid))
        elif f.target == "postgresql":
            lines.append(head + _postgres(conn, f))
        else:
            lines.append(head + _broker(f, fleet, samples))
    return lines


def recovery_times(conn: Conn, f: Fault) -> tuple[int, float | None, float | None]:
    """(stranded, recovered at, detected at) for a process fault."""
    if not f.stranded:
        return 0, None, None
    ids = [s[0] for s in f.stranded]
    attempts = [s[2] for s in f.stranded]
    rows = conn.execute(
        """
        SELECT e.id, e.ended,
               (SELECT min(t.started) FROM execution_attempt t
                WHERE t.execution = e.id AND t.started > to_timestamp(%(at)s)) AS rerun,
               (SELECT min(t.scheduled) FROM execution_attempt t
                WHERE t.execution = e.id AND t.scheduled > to_timestamp(%(at)s)) AS redispatched,
               (SELECT t.ended FROM execution_attempt t
                WHERE t.execution = e.id AND t.attempt = s.attempt AND t.outcome = 'worker_lost') AS lost
        FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS s(id, attempt) JOIN execution e ON e.id = s.id
        """,
        {"at": f.at, "ids": ids, "attempts": attempts},
    ).fetchall()
    recovered: list[float | None] = []
    for r in rows:
        marks = [_ts(r["rerun"] if f.role == "worker" else r["redispatched"]), _ts(r["ended"])]
        found = [m for m in marks if m is not None]
        recovered.append(min(found) if found else None)
    done = None if None in recovered or not recovered else max(x for x in recovered if x is not None)
    lost = [t for r in rows if (t := _ts(r["lost"])) is not None]
    return len(ids), done, max(lost) if lost else None


def _rejoined(f: Fault, by_pid: dict[int, Any], text: str) -> float | None:
    if f.next_pid is None:
        return None
    inc = by_pid.get(f.next_pid)
    if inc is None:
        return None
    times = log_times(inc.proc.stderr_path, text)
    return times[0] if times else None


def _stranded_text(f: Fault) -> str:
    if f.stranded is None:
        return "stranded: unknown (database down)"
    kinds: dict[str, int] = {}
    for _, status, _ in f.stranded:
        kinds[status] = kinds.get(status, 0) + 1
    return "stranded: " + (", ".join(f"{n} {s}" for s, n in sorted(kinds.items())) or "none")


def _worker(conn: Conn, f: Fault, by_pid: dict[int, Any]) -> str:
    _, done, lost = recovery_times(conn, f)
    rejoined = _rejoined(f, by_pid, "worker registered")
    return (
        f" {_stranded_text(f):<34} detected {_after(f.at, lost)}  recovered {_after(f.at, done)}"
        f"  rejoined {_after(f.at, rejoined)}"
    )


def _executor(conn: Conn, f: Fault, by_pid: dict[int, Any]) -> str:
    _, done, _ = recovery_times(conn, f)
    rejoined = _rejoined(f, by_pid, "executor started")
    return f" {_stranded_text(f):<34} {'':17}recovered {_after(f.at, done)}  rejoined {_after(f.at, rejoined)}"


def _postgres(conn: Conn, f: Fault) -> str:
    if f.until is None:
        return " (never came back)"
    row = conn.execute(
        "SELECT min(ended) AS first FROM execution WHERE ended > to_timestamp(%s)", (f.until,)
    ).fetchone()
    first = _ts(row["first"]) if row else None
    return f" back after {f.until - f.at:.2f}s; first execution ended {_after(f.at, first)} after the restart began"


def _broker(f: Fault, fleet: Fleet, samples: list[Sample]) -> str:
    if f.until is None:
        return " (never came back)"
    until = f.until
    reconnected: list[float | None] = []
    for inc in fleet.incarnations():
        if inc.started > until or (inc.died is not None and inc.died < until):
            continue  # started after the broker was back, or dead before it: not a reconnection
        after = [t for t in log_times(inc.proc.stderr_path, "connected to RabbitMQ") if t >= f.at]
        if inc.died is None or after:
            reconnected.append(after[0] if after else None)
    all_back = None if None in reconnected or not reconnected else max(t for t in reconnected if t is not None)
    before = [s.outbox for s in samples if f.at - 10 <= s.at < f.at and s.outbox is not None]
    usual = max(before) if before else 0
    drained = next((s.at for s in samples if s.at >= until and s.outbox is not None and s.outbox <= usual), None)
    return (
        f" stop_app to start_app done {until - f.at:.2f}s; every process reconnected {_after(f.at, all_back)} "
        f"and the outbox back to <= {usual} rows {_after(f.at, drained)} after the restart began"
    )
