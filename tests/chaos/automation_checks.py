"""The checks of events, rules, webhooks and schedules after a chaos run (see
automation.py for what was set up). The primary keys and unique indexes make a slot
fired twice or an enforcement written twice impossible; these check what they do not:
each slot's execution requested once and no slot skipped silently, each event enforced
once per rule its payload matches (computed here, in Python, from the payloads), one
execution per enforcement, pointing back, one event per webhook delivery key, and no
event left pending.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .automation import CUSTOM_TRIGGER, HOOK_TRIGGER, RULES, SCHEDULES

if TYPE_CHECKING:
    import psycopg

    from .automation import EventEmitter, WebhookSender
    from .checks import Report

    Conn = psycopg.Connection[dict[str, Any]]

ONE_SECOND = timedelta(seconds=1)


def run_checks(conn: Conn, report: Report, sender: WebhookSender, emitter: EventEmitter) -> list[str]:
    """The checks, added to ``report``; answers the report's summary lines."""
    lines = _slots(conn, report)
    lines += _enforcements(conn, report)
    _executions(conn, report)
    lines += _deliveries(conn, report, sender, emitter)
    pending = conn.execute("SELECT event, since FROM event_pending ORDER BY event").fetchall()
    report.check("no event left pending", [f"event {r['event']} pending since {r['since']}" for r in pending])
    return lines


def _slots(conn: Conn, report: Report) -> list[str]:
    slots = conn.execute(
        "SELECT s.name, s.overlap, s.catchup, ss.slot, ss.origin, ss.outcome, ss.execution, ss.fired, "
        "e.id AS found, e.action_ref, e.requested_by, e.parent, e.enforcement "
        "FROM schedule_slot ss JOIN schedule s ON s.id = ss.schedule "
        "LEFT JOIN execution e ON e.id = ss.execution ORDER BY s.name, ss.slot"
    ).fetchall()
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in slots:
        by[r["name"]].append(r)
    gaps, wrong, policy = [], [], []
    for name, rows in by.items():
        for a, b in itertools.pairwise(rows):
            if b["slot"] - a["slot"] != ONE_SECOND:
                gaps.append(f"{name}: no slot between {a['slot']:%H:%M:%S} and {b['slot']:%H:%M:%S}")
        for r in rows:
            label = f"{name} slot {r['slot']:%H:%M:%S} ({r['outcome']}, execution {r['execution']})"
            expected = SCHEDULES[name]["action"]
            if r["outcome"] == "requested" and (
                r["found"] is None or r["action_ref"] != expected or r["requested_by"] != f"schedule:{name}"
            ):
                wrong.append(f"{label}: its execution is {r['found']} {r['action_ref']} by {r['requested_by']}")
            elif r["outcome"] != "requested" and r["execution"] is not None:
                wrong.append(f"{label}: names an execution")
            if r["outcome"] not in ("requested", "skipped", "missed", "buffered"):
                wrong.append(f"{label}: {r['outcome']}")
            # Skipped only by an overlap policy; missed only by a catch-up policy that drops.
            if r["outcome"] == "skipped" and r["overlap"] == "allow":
                policy.append(f"{label}: skipped with overlap allow")
            if r["outcome"] == "missed" and r["catchup"] == "all":
                policy.append(f"{label}: missed with catchup all")
        # buffer_one: a slot left waiting (the schedule paused at the end) is the last to
        # have waited: no slot fired after it, so it was never passed over.
        waiting = [r["slot"] for r in rows if r["outcome"] == "buffered"]
        policy += [f"{name} slot {r['slot']:%H:%M:%S} fired while slot {waiting[0]:%H:%M:%S} waited (buffered)"
                   for r in rows if waiting and r["slot"] > waiting[0] and r["execution"] is not None]  # fmt: skip
        if len(waiting) > 1:
            policy.append(f"{name}: {len(waiting)} slots buffered")
    missing = [f"{name}: no slot fired" for name in SCHEDULES if name not in by]
    report.check("no schedule slot absent between a schedule's first and last", missing + gaps)
    report.check("each slot's outcome agrees with its execution", wrong)
    report.check("each slot decided per its schedule's policies", policy)
    # Each slot's execution requested once: exactly the executions requested by schedules,
    # none shared by two slots.
    named = Counter(r["execution"] for r in slots if r["execution"] is not None)
    shared = [f"execution {e} named by {n} slots" for e, n in named.items() if n > 1]
    requested = conn.execute(
        "SELECT id, requested_by FROM execution WHERE requested_by LIKE 'schedule:%%' AND parent IS NULL"
    ).fetchall()
    orphans = [f"execution {r['id']} requested by {r['requested_by']}, no slot names it" for r in requested
               if r["id"] not in named]  # fmt: skip
    report.check("each slot's execution requested once, no two slots share one", shared + orphans,
                 f"{len(slots)} slots, {len(named)} executions")  # fmt: skip
    outcomes = Counter(r["outcome"] for r in slots)
    lags = sorted((r["fired"] - r["slot"]).total_seconds() for r in slots if r["origin"] == "scheduled")
    line = (
        f"Schedules: {len(slots)} slots of {len(by)} schedules ("
        + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items()))
        + f"; origins {dict(Counter(r['origin'] for r in slots))})"
    )
    if len(lags) > 1:
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        line += (
            f"; lag p50 {statistics.median(lags) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms"
        )
    return [line]


def _enforcements(conn: Conn, report: Report) -> list[str]:
    events = conn.execute(
        "SELECT id, trigger, payload FROM event WHERE trigger = ANY(%s)", ([HOOK_TRIGGER, CUSTOM_TRIGGER],)
    ).fetchall()
    rules = {r["ref"]: r["id"] for r in conn.execute("SELECT id, ref FROM rule").fetchall()}
    expected = {
        (rules[ref], e["id"]) for e in events for ref, trig, _, _, _, match in RULES
        if e["trigger"] == trig and match(e["payload"])
    }  # fmt: skip
    rows = conn.execute("SELECT id, rule, rule_ref, event, outcome, error FROM enforcement").fetchall()
    actual = Counter((r["rule"], r["event"]) for r in rows)
    refs = {v: k for k, v in rules.items()}
    problems = [f"event {e}: rule {refs.get(r, r)} matches, no enforcement" for r, e in sorted(expected - set(actual))]
    problems += [
        f"event {e}: rule {refs.get(r, r)} does not match, enforced" for r, e in sorted(set(actual) - expected)
    ]
    problems += [f"event {e}: rule {refs.get(r, r)} enforced {n} times" for (r, e), n in actual.items() if n > 1]
    report.check("each event enforced exactly once per matching rule", problems,
                 f"{len(events)} events, {len(expected)} (rule, event) matches, {len(rows)} enforcements")  # fmt: skip
    # The templates are trivial (well within their 1 s bound, the engine built beforehand).
    refused = [f"enforcement {r['id']} ({r['rule_ref']}, event {r['event']}): {r['outcome']} {r['error']}"
               for r in rows if r["outcome"] != "requested"]  # fmt: skip
    report.check("every enforcement requested its execution", refused)
    outcomes = Counter(r["outcome"] for r in rows)
    return [f"Rules: {len(rows)} enforcements (" + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())) + ")"]


def _executions(conn: Conn, report: Report) -> None:
    bad = conn.execute(
        "SELECT f.id, f.rule_ref, f.execution, e.id AS found, e.enforcement, e.parent FROM enforcement f "
        "LEFT JOIN execution e ON e.id = f.execution "
        "WHERE f.outcome = 'requested' "
        "AND (e.id IS NULL OR e.enforcement IS DISTINCT FROM f.id OR e.parent IS NOT NULL)"
    ).fetchall()
    problems = [f"enforcement {r['id']} ({r['rule_ref']}) names execution {r['execution']}: found {r['found']}, "
                f"its enforcement {r['enforcement']}, parent {r['parent']}" for r in bad]  # fmt: skip
    # One top-level execution per enforcement; none requested by a rule outside one.
    extra = conn.execute(
        "SELECT e.id, e.enforcement, e.requested_by FROM execution e LEFT JOIN enforcement f ON f.id = e.enforcement "
        "WHERE e.parent IS NULL AND (e.requested_by LIKE 'rule:%%' OR e.enforcement IS NOT NULL) "
        "AND (f.id IS NULL OR f.execution IS DISTINCT FROM e.id)"
    ).fetchall()
    problems += [f"execution {r['id']} ({r['requested_by']}, enforcement {r['enforcement']}): "
                 "its enforcement does not name it" for r in extra]  # fmt: skip
    report.check("nothing requested twice for one enforcement (one execution each, pointing back)", problems)


def _deliveries(conn: Conn, report: Report, sender: WebhookSender, emitter: EventEmitter) -> list[str]:
    problems = list(sender.problems)
    loads = ((HOOK_TRIGGER, sender.accepted, sender.tried), (CUSTOM_TRIGGER, emitter.emitted, emitter.tried))
    for trigger, sent, tried in loads:
        rows = conn.execute(
            "SELECT idempotency_key AS key, array_agg(id ORDER BY id) AS ids FROM event WHERE trigger = %s GROUP BY 1",
            (trigger,),
        ).fetchall()
        found = {r["key"]: r["ids"] for r in rows}
        problems += [f"{trigger} key {k}: events {ids}" for k, ids in found.items() if len(ids) != 1]
        problems += [f"{trigger} key {k}: answered event {e}, stored {found.get(k)}" for k, e in sent.items()
                     if found.get(k) != [e]]  # fmt: skip
        problems += [f"{trigger} key {k}: an event nobody sent" for k in found if k not in tried]
    report.check("each webhook delivery key (and event key) made exactly one event", problems,
                 f"{len(sender.accepted)} deliveries, {len(emitter.emitted)} custom events")  # fmt: skip
    answers = ", ".join(f"{k} {n}" for k, n in sorted(sender.answers.items()))
    return [
        f"Webhooks: {sender.sent} POSTs of {len(sender.accepted)} deliveries (answers: {answers}); "
        f"custom events: {len(emitter.emitted)} emitted, {emitter.retries} retries through outages"
    ]
