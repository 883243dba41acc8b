"""The report of a chaos run: what was done (load, faults, duplicates), what came of it
(outcomes, time to recover after each fault) and the checks (checks.py)."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import automation_checks, checks, recovery
from .actions import POLICIES
from .faults import connect

if TYPE_CHECKING:
    from .automation import EventEmitter, WebhookSender
    from .dupes import BrokerDuplicator, NotifyDuplicator
    from .faults import Injector, Monitor, Outages
    from .fleet import Fleet
    from .harness import ChaosConfig, ChaosResult
    from .load import Canceller, Submitter
    from .workflows import InquiryBot


def ensure_policies(db_url: str) -> str:
    """The chaos actions' admission policies come from their definitions (``policy=``);
    a registry without that argument would leave them out: then they are set in SQL."""
    with connect(db_url) as conn:
        have = {r["target"]: r for r in conn.execute("SELECT * FROM admission_policy").fetchall()}
        missing = [ref for ref in POLICIES if ref not in have]
        for ref in missing:
            limit, group, method = POLICIES[ref]
            conn.execute(
                "INSERT INTO admission_policy (target, concurrency, parameters, method) VALUES (%s, %s, %s, %s)",
                (ref, limit, [group] if group else [], method),
            )
        for ref in POLICIES:
            if ref in have:
                row = have[ref]
                limit, group, method = POLICIES[ref]
                expected = (limit, [group] if group else [], method)
                assert (row["concurrency"], list(row["parameters"]), row["method"]) == expected, row
    return "set in SQL (the registry has no policy=)" if missing else "from the actions' definitions (policy=)"


@dataclass
class Inputs:
    config: ChaosConfig
    seed: int
    db_url: str
    fleet: Fleet
    began: float
    chaos_ended: float
    terminal_at: float
    settled: float
    terminal_in_time: bool
    settled_in_time: bool
    injector: Injector
    outages: Outages
    monitor: Monitor
    submitter: Submitter
    canceller: Canceller
    bot: InquiryBot
    sender: WebhookSender
    emitter: EventEmitter
    notify_dupes: NotifyDuplicator
    broker_dupes: BrokerDuplicator | None
    policies: str
    spill: Path
    log_dir: Path


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[")


# The RabbitMQ client library logs its own tracebacks (straight to stderr, not through
# the product's log) when the broker closes connections: expected during the restart.
_BROKER_CLIENT = ("aiormq.exceptions.", "aio_pika.exceptions.")
_RECONNECTING = "error when creating transport: "


def log_errors(fleet: Fleet) -> tuple[list[str], list[str]]:
    """Tracebacks, and error-level lines (with the broker client's own tracebacks), in the
    processes' logs: '<process>: <line>'."""
    tracebacks, errors = [], []
    for inc in fleet.incarnations():
        lines = inc.proc.stderr().splitlines()
        label = f"{inc.member}.{inc.number}"
        for i, line in enumerate(lines):
            if line.startswith("Traceback"):
                j = i + 1
                while j < len(lines) and not _LOG_LINE.match(lines[j]):
                    j += 1
                # aio_pika's robust connection prints its own retries (not log lines) right
                # after a traceback of its own: not the exception line.
                last = next((s for s in reversed(lines[i:j]) if s.strip() and not s.startswith(_RECONNECTING)), line)
                text = f"{label}: {last.strip()[:200]}"
                if last.strip().startswith(_BROKER_CLIENT):
                    errors.append(f"{text} (broker client library)")
                else:
                    tracebacks.append(text)
            elif " [error    ] " in line or " [critical " in line:
                errors.append(f"{label}: {line.split('] ', 1)[-1][:200]}")
    return tracebacks, errors


def _all_lines(fleet: Fleet, text: str) -> list[str]:
    return [
        f"{inc.member}.{inc.number}: {line.split('] ', 1)[-1][:200]}"
        for inc in fleet.incarnations()
        for line in inc.proc.stderr().splitlines()
        if text in line
    ]


def build(i: Inputs) -> ChaosResult:
    from .harness import ChaosResult

    fleet, config = i.fleet, i.config
    with connect(i.db_url) as conn:
        rows = [
            (inc.pid, inc.member, fleet.members[inc.member].role, inc.started, inc.died, inc.cause)
            for inc in fleet.incarnations()
        ]
        checks.record_processes(conn, rows)
        spilled = checks.merge_spills(conn, i.spill)
        report = checks.Report()
        checks.run_checks(conn, report, dict(i.submitter.confirmed), config.transport)
        automation_lines = automation_checks.run_checks(conn, report, i.sender, i.emitter)
        faults = sorted([*i.injector.faults, *i.outages.faults], key=lambda f: f.at)
        exits = [f"{f.target} (pid {f.pid}) {f.kind}" for f in faults if f.kind.startswith("exited")]
        report.check("no process exited on its own (failpoints aside)", exits)
        tracebacks, errors = log_errors(fleet)
        report.check("no process logged a traceback", _counted(tracebacks))
        # The database is never down for 30 s here: a pool timeout is a process starving itself.
        # (The API waits a second on purpose -- api's pool timeout -- and answers 503 while the
        # database restarts: the webhook sender retries, and its checks cover the outcome.)
        starved = [line for line in _all_lines(fleet, "couldn't get a connection after") if not line.startswith("api.")]
        report.check("no process waited out its pool timeout for a connection", _counted(starved))
        harness = [
            f"{t.name}: {t.error!r}"
            for t in (i.injector, i.outages, i.submitter, i.canceller, i.bot, i.sender, i.emitter)
            if t.error is not None
        ]
        for inc in fleet.incarnations():
            spec = inc.failpoints
            if spec and not (inc.cause or "").startswith("failpoint") and inc.started < i.chaos_ended - 15:
                harness.append(f"{inc.member}.{inc.number} armed with {spec} never reached it")
        if not i.terminal_in_time:
            harness.append(f"executions still not terminal {config.settle_timeout:g}s after the chaos ended")
        report.check("the harness did all it meant to", harness)
        recovery_lines = recovery.describe(conn, faults, fleet, i.monitor.samples, i.began)
        stats = _recovery_stats(conn, faults)
        outcome_lines = _outcomes(conn)
        runs = conn.execute("SELECT count(*) AS n FROM public.chaos_ledger").fetchone()
        _save(conn, i, bool(report.violations))

    kills = Counter(f"{f.role} {f.kind}" for f in faults if f.role != "server")
    fired = [f"{f.target}: {f.kind}" for f in faults if f.kind.startswith("failpoint")]
    executions = len(i.submitter.confirmed)
    out = [
        f"=== Conveyor chaos run: transport {config.transport}, seed {i.seed}",
        f"  {config.executors} executors, {config.workers} workers (concurrency {config.concurrency}); "
        f"{i.chaos_ended - i.began:.1f}s of load and faults at {config.rate:g}/s; every execution ended "
        f"{i.terminal_at - i.chaos_ended:.1f}s later, all settled (slots, dead letters, workers) after "
        f"{i.settled - i.chaos_ended:.1f}s; admission policies {i.policies}",
        f"Load: {executions} executions requested ("
        + ", ".join(f"{ref} {n}" for ref, n in sorted(i.submitter.by_action.items()))
        + f"); {i.submitter.retries} submission retries through outages; {runs['n'] if runs else 0} runs",
        "  cancels (state found in: result): "
        + ", ".join(f"{s}: {r} {n}" for (s, r), n in sorted(i.canceller.results.items())),
        "  inquiries answered by the bot (outcome): "
        + (", ".join(f"{k} {n}" for k, n in sorted(i.bot.results.items())) or "none"),
        *outcome_lines,
        *automation_lines,
        "Faults: "
        + (", ".join(f"{n} x {k}" for k, n in sorted(kills.items())) or "no process faults")
        + "; restarts refused: "
        + (", ".join(f"{n} x {why}" for why, n in sorted(i.injector.refusals.items())) or "none"),
        "  failpoints fired: " + (", ".join(fired) or "none"),
        "  duplicates: "
        + ", ".join(
            [f"{i.notify_dupes.sent} NOTIFYs", f"{i.notify_dupes.replayed} workflow children's completions replayed"]
            + ([f"{n} {what}" for what, n in sorted(i.broker_dupes.counts.items())] if i.broker_dupes else [])
        ),
        f"  ends of runs spilled to files while the database was down: {spilled}",
        "Recovery after each fault (times from the fault; see tests/chaos/recovery.py for the definitions):",
        *recovery_lines,
        *stats["lines"],
        "Checks:",
        *report.lines,
        "Errors the processes logged (for reading; expected: a worker fencing itself while the database restarts,"
        " the broker client's tracebacks while RabbitMQ restarts):",
        *([f"  {e}" for e in _counted(errors)] or ["  none"]),
        f"Result: {'no violations' if not report.violations else f'{len(report.violations)} VIOLATIONS'}"
        f" (processes' logs in {i.log_dir})",
    ]
    figures: dict[str, object] = {
        "executions": executions,
        "chaos_seconds": round(i.chaos_ended - i.began, 1),
        "kills": sum(kills.values()),
        **stats["figures"],
    }
    return ChaosResult("\n".join(out), report.violations, figures, i.log_dir)


def _counted(items: list[str]) -> list[str]:
    counts = Counter(re.sub(r"\d+", "N", item) for item in items)
    firsts: dict[str, str] = {}
    for item in items:
        firsts.setdefault(re.sub(r"\d+", "N", item), item)
    return [f"{firsts[k]}" + (f" (x{n})" if n > 1 else "") for k, n in counts.most_common()]


def _outcomes(conn: Any) -> list[str]:
    by = conn.execute("SELECT action_ref, status, count(*) AS n FROM execution GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    actions: dict[str, list[str]] = {}
    for r in by:
        actions.setdefault(r["action_ref"], []).append(f"{r['status']} {r['n']}")
    attempts = conn.execute(
        "SELECT coalesce(outcome, 'open') AS outcome, count(*) AS n FROM execution_attempt GROUP BY 1 ORDER BY 2 DESC"
    ).fetchall()
    unusual = conn.execute(
        "SELECT status, result ->> 'error' AS error, count(*) AS n FROM execution "
        "WHERE status IN ('failed', 'abandoned', 'timeout') AND action_ref <> 'chaos.failing' "
        "GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 8"
    ).fetchall()
    lines = ["Outcomes:"]
    lines += [f"  {ref}: {', '.join(parts)}" for ref, parts in actions.items()]
    lines.append("  attempts by outcome: " + ", ".join(f"{r['outcome']} {r['n']}" for r in attempts))
    for r in unusual:
        lines.append(f"  ended by the product's policies: {r['n']} x {r['status']} ({r['error']})")
    return lines


def _recovery_stats(conn: Any, faults: list[Any]) -> dict[str, Any]:
    durations: dict[str, list[float]] = {"worker": [], "executor": []}
    detect: list[float] = []
    for f in faults:
        if f.role not in durations:
            continue
        n, done, lost = recovery.recovery_times(conn, f)
        if n and done is not None:
            durations[f.role].append(done - f.at)
        if lost is not None:
            detect.append(lost - f.at)
    lines, figures = [], {}
    for role, values in durations.items():
        if values:
            lines.append(
                f"  {role} deaths that stranded work: {len(values)}; all of it running again or ended after "
                f"median {statistics.median(values):.2f}s, max {max(values):.2f}s"
            )
            figures[f"{role}_recovery_max_s"] = round(max(values), 2)
            figures[f"{role}_recovery_median_s"] = round(statistics.median(values), 2)
    if detect:
        lines.append(f"  lost running work detected (attempt closed worker_lost) after median "
                     f"{statistics.median(detect):.2f}s, max {max(detect):.2f}s")  # fmt: skip
    return {"lines": lines, "figures": figures}


def _save(conn: Any, i: Inputs, everything: bool) -> None:
    """The cancels always; with violations, the tables the checks read, as CSV, so the
    evidence outlives the private server."""
    with open(i.log_dir / "cancels.csv", "w") as out:
        out.write("time,execution,found_in,result\n")
        out.writelines(f"{t:.3f},{e},{s},{r}\n" for t, e, s, r in i.canceller.log)
    if not everything:
        return
    folder = i.log_dir / "db"
    folder.mkdir(exist_ok=True)
    tables = [
        *("execution", "execution_attempt", "dead_letter", "worker"),
        *("execution_admission_slot", "execution_admission_queue"),
        *("public.chaos_ledger", "public.chaos_process", "public.chaos_submission"),
        *("event", "event_pending", "enforcement", "rule", "schedule", "schedule_slot"),
    ]
    for table in tables:
        query = f"COPY (SELECT * FROM {table}) TO STDOUT WITH CSV HEADER"
        path = folder / f"{table.removeprefix('public.')}.csv"
        with open(path, "wb") as out, conn.cursor() as cur, cur.copy(query) as copy:
            for data in copy:
                out.write(bytes(data))
