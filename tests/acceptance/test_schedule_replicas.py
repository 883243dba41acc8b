"""Acceptance (issue #13): a schedule every second fired by two executor replicas, one
SIGKILLed at a slot boundary -- with that slot's row written, its execution requested,
nothing committed (failpoint ``schedules.after_slot_row``). The other replica fires the
slot: every slot exactly once, none missed, each within a generous bound of its time
(measured on the database clock: schedule_slot.fired - slot)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, until
from acceptance.workflow_kit import Conn, start_executor
from conveyor.ops.failpoints import ENV as FAILPOINTS

pytestmark = pytest.mark.acceptance

SIGKILLED = -9


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def fired_slots(db: Conn) -> list[dict[str, Any]]:
    return db.execute(
        "SELECT ss.slot, ss.outcome, ss.execution, extract(epoch FROM ss.fired - ss.slot)::float8 AS lag "
        "FROM schedule_slot ss JOIN schedule s ON s.id = ss.schedule WHERE s.name = 'tick' ORDER BY ss.slot"
    ).fetchall()


def test_replica_killed_at_a_slot_boundary(procs: Procs, db: Conn, env: dict[str, str]) -> None:
    steady = start_executor(procs, env, "executor-steady")
    # Dies the 3rd time it writes a slot row (the replicas race for each slot: it wins some).
    doomed = start_executor(procs, env, "executor-doomed", **{FAILPOINTS: "schedules.after_slot_row@3"})
    created = procs.run("schedules", "create", "tick", "--interval", "1s", "core.noop")
    assert created.returncode == 0, created.stderr
    until(procs, lambda: doomed.returncode is not None, timeout=60)
    assert doomed.returncode == SIGKILLED, doomed.logs()
    assert "failpoint schedules.after_slot_row" in doomed.stderr()
    killed_at = len(fired_slots(db))
    until(procs, lambda: len(fired_slots(db)) >= killed_at + 4, timeout=20)  # the survivor goes on
    assert steady.returncode is None

    rows = fired_slots(db)
    gaps = [(b["slot"] - a["slot"]).total_seconds() for a, b in itertools.pairwise(rows)]
    assert all(abs(g - 1.0) < 1e-6 for g in gaps), gaps  # none missed, none doubled
    assert {r["outcome"] for r in rows} == {"requested"}
    executions = db.execute("SELECT count(*) AS n FROM execution WHERE requested_by = 'schedule:tick'").fetchone()
    assert executions == {"n": len({r["execution"] for r in rows})}  # the killed pass requested nothing
    lags = sorted(r["lag"] for r in rows)
    print(f"{len(rows)} slots; lag median {lags[len(lags) // 2] * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms")
    assert lags[-1] < 1.0, lags  # generous: the p99 of 250 ms is the benchmark's figure
    assert lags[len(lags) // 2] < 0.25, lags


@pytest.mark.parametrize(("policy", "late_fired"), [("all", True), ("skip", False)])
def test_outage_of_every_executor(procs: Procs, db: Conn, env: dict[str, str], policy: str, late_fired: bool) -> None:
    """Every executor down for 14 slots (longer than the 10 s on-time grace), then back:
    with catch-up all each slot of the outage fires (origin catchup); with skip the late
    ones are recorded missed. Either way no slot is absent or doubled."""
    first = start_executor(procs, env, "executor-1")
    created = procs.run("schedules", "create", "tick", "--interval", "1s", "core.noop", "--catchup", policy)
    assert created.returncode == 0, created.stderr
    until(procs, lambda: len(fired_slots(db)) >= 2, timeout=20)
    first.kill()
    down = db.execute("SELECT now() AS t").fetchone()
    until(procs, lambda: db.execute("SELECT now() - %s > interval '14 s' AS x", (down["t"],)).fetchone()["x"],
          timeout=30)  # fmt: skip
    start_executor(procs, env, "executor-2")
    until(procs, lambda: db.execute("SELECT max(slot) > now() - interval '1 s' AS x FROM schedule_slot")
          .fetchone()["x"], timeout=20)  # fmt: skip
    rows = db.execute("SELECT slot, origin, outcome FROM schedule_slot ORDER BY slot").fetchall()
    gaps = [(b["slot"] - a["slot"]).total_seconds() for a, b in itertools.pairwise(rows)]
    assert all(abs(g - 1.0) < 1e-6 for g in gaps), gaps  # none absent, none doubled
    late = [r for r in rows if r["origin"] == "catchup"]
    assert len(late) >= 3, rows
    assert {r["outcome"] for r in late} == ({"requested"} if late_fired else {"missed"})
