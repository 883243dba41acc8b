"""Acceptance: rules enforce each (rule, event) exactly once when the executor is
SIGKILLed mid-pass, with real executor processes.

The doomed executor evaluates events in batches of 3 and SIGKILLs itself on its second
pass at a failpoint (conveyor/ops/failpoints.py, executor/events.py): after locking its
events and before any enforcement (``events.after_claim``: between event and
enforcement), after enforce_events wrote the enforcements and requested their executions
but before commit (``events.after_enforcement``: between enforcement and execution being
committed), and just after commit (``events.after_commit``). A replacement then finishes
the work. The database must show, for each event, exactly one enforcement per matching
rule, none for the rule that does not match, and exactly one execution per 'requested'
enforcement -- read from the rows alone.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from acceptance.helpers import Procs, conveyor_env, until
from acceptance.workflow_kit import SIGKILLED, start_executor

pytestmark = pytest.mark.acceptance
Conn = psycopg.Connection[dict[str, Any]]
EVENTS = 10
SETTINGS = {"CONVEYOR__EVENTS__POLL_INTERVAL": "0.2", "CONVEYOR__EVENTS__BATCH_SIZE": "3"}


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, **SETTINGS)


def setup(db: Conn) -> list[int]:
    """Two rules that match every even event, one that matches none; EVENTS events."""
    db.execute("INSERT INTO action (ref, pack, name, runner_type, runtime) VALUES ('crash.echo', 'crash', 'echo', "
               "'python', 'python')")  # fmt: skip
    db.execute("SELECT register_trigger('crash.tick', 'custom')")
    even = Jsonb({"trigger.n": {"type": "in", "pattern": list(range(0, EVENTS, 2))}})
    for ref, criteria in (("crash.a", even), ("crash.b", even),
                          ("crash.never", Jsonb({"trigger.n": {"type": "lt", "pattern": 0}}))):  # fmt: skip
        db.execute("SELECT register_rule(%s, 'crash.tick', %s, 'crash.echo', %s)",
                   (ref, criteria, Jsonb({"n": "{{ trigger.n }}"})))  # fmt: skip
    return [
        db.execute("SELECT emit_event('crash.tick', %s) AS id", (Jsonb({"n": n}),)).fetchone()["id"]  # type: ignore[index]
        for n in range(EVENTS)
    ]


def pending(db: Conn) -> int:
    return int(db.execute("SELECT count(*) AS n FROM event_pending").fetchone()["n"])  # type: ignore[index]


def check(db: Conn, events: list[int]) -> None:
    rows = db.execute(
        "SELECT e.id, (e.payload->>'n')::int AS n,"
        " array_agg(f.rule_ref ORDER BY f.rule_ref) FILTER (WHERE f.id IS NOT NULL) AS rules"
        " FROM event e LEFT JOIN enforcement f ON f.event = e.id WHERE e.id = ANY(%s) GROUP BY e.id ORDER BY e.id",
        (events,),
    ).fetchall()  # fmt: skip
    for r in rows:
        assert r["rules"] == (["crash.a", "crash.b"] if r["n"] % 2 == 0 else None), r
    per_enforcement = db.execute(
        "SELECT f.id, f.outcome, f.execution, (SELECT count(*) FROM execution x WHERE x.enforcement = f.id) AS made,"
        " (SELECT x.parameters FROM execution x WHERE x.id = f.execution) AS parameters, f.event"
        " FROM enforcement f ORDER BY f.id"
    ).fetchall()  # fmt: skip
    assert len(per_enforcement) == EVENTS  # 5 even events x 2 rules
    for f in per_enforcement:
        assert f["outcome"] == "requested", f
        assert f["made"] == 1, f
    total = db.execute("SELECT count(*) AS n FROM execution").fetchone()
    assert total == {"n": EVENTS}, "an execution without its enforcement, or one requested twice"


def test_rules_without_faults(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """The baseline the crash scenarios are held to."""
    events = setup(db)
    start_executor(procs, env, "executor")
    until(procs, lambda: pending(db) == 0)
    check(db, events)


INSIDE = ("events.after_claim", "events.after_enforcement", "events.before_commit")


@pytest.mark.parametrize("point", [*INSIDE, "events.after_commit"])
def test_executor_killed_mid_pass(procs: Procs, env: dict[str, str], db: Conn, point: str) -> None:
    events = setup(db)
    doomed = start_executor(procs, env, "doomed", CONVEYOR_FAILPOINTS=f"{point}@2")
    assert doomed.wait(30) == SIGKILLED, doomed.logs()
    assert f"failpoint {point}: SIGKILL" in doomed.stderr()
    left = pending(db)
    # Pass 1 committed its 3 events; pass 2 died: rolled back (its 3 still pending) or committed.
    assert left == (EVENTS - 3 if point in INSIDE else EVENTS - 6), left
    written = db.execute("SELECT count(DISTINCT event) AS n FROM enforcement").fetchone()
    assert written is not None
    assert written["n"] < 5, "the crash was meant to leave events unenforced"
    start_executor(procs, env, "replacement")
    until(procs, lambda: pending(db) == 0)
    check(db, events)


def test_two_executors_one_killed_mid_pass(procs: Procs, env: dict[str, str], db: Conn) -> None:
    """Two replicas on one queue; one dies holding a batch (its locks die
    with its connection); the survivor enforces what it left, nothing twice."""
    events = setup(db)
    doomed = start_executor(procs, env, "doomed", CONVEYOR_FAILPOINTS="events.after_enforcement@1")
    start_executor(procs, env, "survivor")
    assert doomed.wait(30) == SIGKILLED, doomed.logs()
    until(procs, lambda: pending(db) == 0)
    check(db, events)
