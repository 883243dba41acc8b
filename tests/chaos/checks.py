"""The end-of-run checks: SQL over what the database recorded (execution,
execution_attempt, the admission tables, dead_letter, worker) and the runs' own ledger
(``public.chaos_ledger``), joined with the harness's record of which process died when
(``public.chaos_process``). Each check adds a line to the report and, when it fails,
violations with the rows that show it.

A run's interval is [started, ended) as the action recorded it; a run whose process was
SIGKILLed (or killed itself at a failpoint) never recorded its end: it ended when its
process died (the harness's time of the kill; for a failpoint, when it saw the process
gone, at most 50 ms late).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from conveyor.domain.status import TERMINAL

from . import workflows
from .actions import POLICIES

SHOW = 8  # rows shown per failed check
Conn = psycopg.Connection[dict[str, Any]]

# The runs, each with its effective end (see the module docstring).
RUNS = """
SELECT l.id, l.execution, l.attempt, l.worker, l.pid, l.action, l.started, l.ended, l.outcome,
       coalesce(l.ended, p.died) AS until, p.died IS NOT NULL AS process_died, p.cause,
       e.parameters ->> 'group' AS grp, t.outcome AS attempt_outcome
FROM public.chaos_ledger l
JOIN execution e ON e.id = l.execution
LEFT JOIN public.chaos_process p ON p.pid = l.pid
LEFT JOIN execution_attempt t ON t.execution = l.execution AND t.attempt = l.attempt
"""


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def check(self, title: str, problems: Sequence[str], summary: str = "") -> None:
        mark = "ok" if not problems else "FAIL"
        self.lines.append(f"  [{mark}] {title}" + (f": {summary}" if summary else ""))
        for p in problems[:SHOW]:
            self.lines.append(f"         - {p}")
        if len(problems) > SHOW:
            self.lines.append(f"         - ... and {len(problems) - SHOW} more")
        self.violations.extend(f"{title}: {p}" for p in problems)

    def note(self, text: str) -> None:
        self.lines.append(text)


def _rows(conn: Conn, query: str, params: Any = None) -> list[dict[str, Any]]:
    return conn.execute(query, params).fetchall()


def _short(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in row.items())


def _fmt(v: Any) -> str:
    if isinstance(v, datetime):
        return v.strftime("%H:%M:%S.%f")[:-3]
    return str(v)


def merge_spills(conn: Conn, folder: Path) -> int:
    """Ends the runs could not write (database down) and spilled to files."""
    merged = 0
    for path in sorted(folder.glob("spill-*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            cur = conn.execute(
                "UPDATE public.chaos_ledger SET ended = to_timestamp(%s), outcome = %s "
                "WHERE token = %s AND ended IS NULL",
                (item["ended"], item["outcome"], item["token"]),
            )
            merged += cur.rowcount
    return merged


def record_processes(conn: Conn, processes: Iterable[tuple[int, str, str, float, float | None, str | None]]) -> None:
    """(pid, member, role, started, died, cause) of every process the run started."""
    conn.execute("TRUNCATE public.chaos_process")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO public.chaos_process VALUES (%s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s)",
            list(processes),
        )


def run_checks(conn: Conn, report: Report, submitted: dict[int, int], transport: str) -> None:
    _terminal(conn, report, submitted)
    runs = _rows(conn, RUNS)
    _attempts(conn, report)
    _completion(conn, report)
    _ledger(conn, report, runs)
    _overlaps(report, runs)
    _limits(report, runs)
    _fifo(report, runs)
    _leftovers(conn, report, transport)
    workflows.run_checks(conn, report)


def _terminal(conn: Conn, report: Report, submitted: dict[int, int]) -> None:
    recorded = {r["n"]: r["execution"] for r in _rows(conn, "SELECT n, execution FROM public.chaos_submission")}
    executions = {r["id"] for r in _rows(conn, "SELECT id FROM execution")}
    lost = [
        f"submission {n} (execution {e}) confirmed but not recorded"
        for n, e in submitted.items()
        if recorded.get(n) != e
    ]
    lost += [f"execution {e} of submission {n} is gone" for n, e in recorded.items() if e not in executions]
    # A workflow's children are requested by the workflow, not the submitter; rules and
    # schedules request theirs (automation_checks.py accounts for those).
    children = {
        r["id"]
        for r in _rows(
            conn,
            "SELECT id FROM execution WHERE parent IS NOT NULL OR enforcement IS NOT NULL "
            "OR requested_by LIKE 'schedule:%%'",
        )
    }
    unknown = sorted(executions - set(recorded.values()) - children)
    lost += [f"execution {e} was never submitted" for e in unknown]
    report.check("none lost", lost, f"{len(submitted)} submissions confirmed, {len(executions)} executions")
    stuck = _rows(
        conn,
        "SELECT e.id, e.action_ref, e.status, e.attempt, w.name AS worker, e.not_before, e.updated "
        "FROM execution e LEFT JOIN worker w ON w.id = e.worker WHERE e.status <> ALL(%s) ORDER BY e.id",
        (list(TERMINAL),),
    )
    report.check("every execution terminal (none stuck)", [_short(r) for r in stuck], f"{len(stuck)} not terminal")


def _attempts(conn: Conn, report: Report) -> None:
    gaps = _rows(
        conn,
        "SELECT e.id, e.status, e.attempt, array_remove(array_agg(t.attempt ORDER BY t.attempt), NULL) AS attempts "
        "FROM execution e LEFT JOIN execution_attempt t ON t.execution = e.id GROUP BY e.id "
        "HAVING array_remove(array_agg(t.attempt ORDER BY t.attempt), NULL) "
        "       <> ARRAY(SELECT generate_series(1, e.attempt))",
    )
    open_ = _rows(
        conn,
        "SELECT t.execution, t.attempt, t.worker_name, e.status FROM execution_attempt t "
        "JOIN execution e ON e.id = t.execution WHERE t.outcome IS NULL AND e.status = ANY(%s) ORDER BY 1, 2",
        (list(TERMINAL),),
    )
    total = _rows(conn, "SELECT count(*) AS n, coalesce(max(attempt), 0) AS most FROM execution_attempt")[0]
    problems = [f"attempts not 1..{r['attempt']}: {_short(r)}" for r in gaps]
    problems += [f"attempt never closed: {_short(r)}" for r in open_]
    report.check("attempts numbered without gaps, all closed", problems,
                 f"{total['n']} attempts, up to {total['most']} for one execution")  # fmt: skip


def _completion(conn: Conn, report: Report) -> None:
    twice = _rows(
        conn,
        "SELECT execution, count(*) AS completed FROM execution_attempt WHERE outcome = 'completed' "
        "GROUP BY execution HAVING count(*) > 1",
    )
    unmatched = _rows(
        conn,
        "SELECT e.id, e.attempt FROM execution e JOIN action a ON a.ref = e.action_ref "
        "WHERE e.status = 'completed' AND a.runner_type NOT IN ('workflow', 'inquiry') AND NOT EXISTS ("
        "  SELECT 1 FROM execution_attempt t WHERE t.execution = e.id AND t.attempt = e.attempt"
        "  AND t.outcome = 'completed')",
    )
    n = _rows(conn, "SELECT count(*) AS n FROM execution WHERE status = 'completed'")[0]["n"]
    problems = [f"completed more than once: {_short(r)}" for r in twice]
    problems += [f"completed, but its last attempt is not the completed one: {_short(r)}" for r in unmatched]
    report.check("completion recorded once", problems, f"{n} completed")


def _ledger(conn: Conn, report: Report, runs: list[dict[str, Any]]) -> None:
    twice = _rows(
        conn,
        "SELECT execution, attempt, array_agg(worker) AS workers FROM public.chaos_ledger "
        "GROUP BY 1, 2 HAVING count(*) > 1",
    )
    strays = _rows(
        conn,
        "SELECT l.execution, l.attempt, l.worker, t.worker_name, t.started AS claimed, l.started, t.outcome "
        "FROM public.chaos_ledger l LEFT JOIN execution_attempt t ON t.execution = l.execution "
        "AND t.attempt = l.attempt WHERE t.execution IS NULL OR t.worker_name <> l.worker OR t.started IS NULL "
        "OR l.started < t.started",
    )
    unrun = _rows(
        conn,
        "SELECT t.execution, t.attempt, t.worker_name, t.outcome FROM execution_attempt t "
        "WHERE t.outcome IN ('completed', 'failed') AND NOT EXISTS (SELECT 1 FROM public.chaos_ledger l "
        "WHERE l.execution = t.execution AND l.attempt = t.attempt)",
    )
    problems = [f"one attempt ran twice: {_short(r)}" for r in twice]
    problems += [
        f"a run its attempt record does not account for (unclaimed, other worker): {_short(r)}" for r in strays
    ]
    problems += [f"a result recorded for a run that never happened: {_short(r)}" for r in unrun]
    open_runs = [r for r in runs if r["until"] is None]
    problems += [f"a run on a live process never ended: {_run(r)}" for r in open_runs]
    report.check("each run is its attempt's, once", problems, f"{len(runs)} runs in the ledger")


def _run(r: dict[str, Any]) -> str:
    end = _fmt(r["until"]) if r["until"] is not None else "open"
    died = " (process killed)" if r["ended"] is None and r["process_died"] else ""
    return f"{r['execution']}#{r['attempt']} on {r['worker']} {_fmt(r['started'])}-{end}{died}"


def _overlaps(report: Report, runs: list[dict[str, Any]]) -> None:
    """Two runs of one execution at once: allowed only when the earlier attempt was
    fenced -- closed worker_lost: its worker was declared dead (or detached its work
    after losing its standing), so another may run it -- and even then it counts."""
    by_execution: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_execution[r["execution"]].append(r)
    explained, problems = [], []
    for items in by_execution.values():
        items.sort(key=lambda r: (r["attempt"], r["started"]))
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                if a["attempt"] == b["attempt"]:
                    continue  # one attempt ran twice: reported by the ledger check
                a_end, b_end = a["until"], b["until"]
                if (a_end is None or b["started"] < a_end) and (b_end is None or a["started"] < b_end):
                    text = f"{_run(a)} [{a['attempt_outcome']}] overlaps {_run(b)}"
                    (explained if a["attempt_outcome"] == "worker_lost" else problems).append(text)
    summary = f"{len(by_execution)} executions ran; {len(explained)} overlaps, each with a fenced earlier attempt"
    report.check("no execution ran on two live workers at once", problems, summary)
    for text in explained[:SHOW]:
        report.note(f"         (fenced) {text}")


def _limits(report: Report, runs: list[dict[str, Any]]) -> None:
    """At no instant more distinct executions of a group running than its limit. What the
    product guarantees: a slot is held from admission until the execution ends (its
    re-runs keep it), so runs of different executions of a group never overlap beyond
    the limit -- a run of a killed process counting until the kill, a run stopped by its
    worker until the action saw the stop (these actions are async: they stop at once)."""
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        policy = POLICIES.get(r["action"])
        if policy is not None:
            groups[(r["action"], r["grp"] if policy[1] else None)].append(r)
    problems, peaks = [], []
    for (ref, grp), items in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or "")):
        limit = POLICIES[ref][0]
        events = []
        for r in items:
            events.append((r["started"], 1, r["execution"]))
            if r["until"] is not None:
                events.append((r["until"], 0, r["execution"]))  # ends before starts at one instant
        events.sort(key=lambda e: (e[0], e[1]))
        open_: Counter[int] = Counter()
        peak = 0
        for at, kind, eid in events:
            if kind:
                open_[eid] += 1
            else:
                open_[eid] -= 1
                if not open_[eid]:
                    del open_[eid]
            peak = max(peak, len(open_))
            if len(open_) > limit:
                problems.append(
                    f"{ref} group {grp}: {len(open_)} running at {_fmt(at)}, limit {limit}: {sorted(open_)}"
                )
        peaks.append(f"{ref}{'/' + grp if grp else ''} {peak}/{limit}")
    report.check("concurrency limits never exceeded", problems, "peak/limit " + ", ".join(peaks))


def _fifo(report: Report, runs: list[dict[str, Any]]) -> None:
    """Concurrency-1 enqueue groups: executions first start in request (id) order."""
    first: dict[tuple[str, str | None], dict[int, datetime]] = defaultdict(dict)
    for r in runs:
        policy = POLICIES.get(r["action"])
        if policy is None or policy[0] != 1 or policy[2] != "enqueue":
            continue
        group = first[(r["action"], r["grp"])]
        group[r["execution"]] = min(group.get(r["execution"], r["started"]), r["started"])
    problems, checked = [], 0
    for (ref, grp), starts in sorted(first.items(), key=lambda g: (g[0][0], g[0][1] or "")):
        order = sorted(starts, key=lambda e: (starts[e], e))
        checked += len(order)
        for earlier, later in itertools.pairwise(order):
            if later < earlier:
                problems.append(f"{ref} group {grp}: execution {later} started at {_fmt(starts[later])} after "
                                f"{earlier} ({_fmt(starts[earlier])}), requested before it")  # fmt: skip
    report.check("FIFO order within each concurrency-1 group", problems, f"{checked} executions in {len(first)} groups")


def _leftovers(conn: Conn, report: Report, transport: str) -> None:
    slots = _rows(
        conn,
        "SELECT s.execution, s.policy, s.group_key, e.status FROM execution_admission_slot s "
        "JOIN execution e ON e.id = s.execution ORDER BY 1",
    )
    queued = _rows(
        conn,
        "SELECT q.execution, q.policy, q.group_key, e.status FROM execution_admission_queue q "
        "JOIN execution e ON e.id = q.execution ORDER BY 1",
    )
    problems = [f"slot still held: {_short(r)}" for r in slots] + [f"still queued: {_short(r)}" for r in queued]
    report.check("every slot released, no admission row left", problems)
    letters = _rows(conn, "SELECT reason, coalesce(resolution, 'PENDING') AS resolution, count(*) AS n "
                          "FROM dead_letter GROUP BY 1, 2 ORDER BY 1, 2")  # fmt: skip
    pending = _rows(
        conn,
        "SELECT id, reason, message_type, execution, attempt, error, deliveries FROM dead_letter "
        "WHERE resolution IS NULL ORDER BY id",
    )
    summary = ", ".join(f"{r['reason']}->{r['resolution']} {r['n']}" for r in letters) or "none arose"
    report.check("no dead letter unresolved", [_short(r) for r in pending], summary)
    workers = _rows(
        conn,
        "SELECT name, status, round(extract(epoch FROM now() - last_heartbeat)::numeric, 1) AS heartbeat_age "
        "FROM worker WHERE status <> 'active' OR last_heartbeat < now() - make_interval(secs => stale_after) "
        "ORDER BY name",
    )
    report.check("every worker active again at the end", [_short(r) for r in workers])
    if transport == "rabbitmq":
        depth = _rows(conn, "SELECT count(*) AS n FROM outbox")[0]["n"]
        report.check("outbox drained", [f"{depth} rows left in the outbox"] if depth else [])
