"""Acceptance (issue #25, point 7): an executor replica frozen (SIGSTOP) for 20 s inside a
rules pass (its pending events locked) or a workflow advancement (its workflows locked)
delays the work it holds by at most executor_liveness.hold_timeout (4 s), then the healthy
replica takes it up; before, it waited for the freeze to end. Each event is still enforced
once and each workflow advanced exactly once. The freeze is a failpoint (``<point>:stop``)."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from acceptance.helpers import Procs, conveyor_env, until
from acceptance.recovery_kit import RECOVERY_SETTINGS, start_worker
from acceptance.workflow_kit import (
    FAST,
    WORKFLOW_SETTINGS,
    Conn,
    all_ended,
    check_workflows,
    register_all,
    start_executor,
)
from conveyor.ops.failpoints import ENV as FAILPOINTS
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance

FREEZE = 20.0
# hold_timeout (4 s) plus what the healthy replica then needs, on a loaded machine: a 20 s
# wait (the freeze) fails it.
BOUND = 10.0


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, **RECOVERY_SETTINGS, **WORKFLOW_SETTINGS, CONVEYOR__EVENTS__POLL_INTERVAL="0.2")


def freeze_while(procs: Procs, frozen: Any, point: str, make: Any, probe: Any = None) -> Any:
    """Call ``make`` until ``frozen`` stops at ``point`` (the replicas race for the work),
    then on through FREEZE seconds, then resume it. ``probe``: called once BOUND seconds
    into the freeze (the replica still stopped); its answer is returned."""
    until(procs, lambda: make() or f"failpoint {point}: SIGSTOP" in frozen.stderr(), timeout=60, interval=0.3)
    stopped_at = time.monotonic()
    probed = None
    try:
        while time.monotonic() - stopped_at < FREEZE:
            make()
            if probe is not None and probed is None and time.monotonic() - stopped_at >= BOUND:
                probed = probe()
            time.sleep(0.5)
    finally:
        frozen.signal(signal.SIGCONT)
    return probed


def test_a_replica_frozen_inside_a_rules_pass(procs: Procs, db: Conn, env: dict[str, str]) -> None:
    db.execute("INSERT INTO action (ref, pack, name, runner_type, runtime) VALUES ('frz.echo', 'frz', 'echo', "
               "'python', 'python')")  # fmt: skip
    db.execute("SELECT register_trigger('frz.tick', 'custom')")
    db.execute("SELECT register_rule('frz.all', 'frz.tick', '{}', 'frz.echo', %s)", (Jsonb({"n": "{{ trigger.n }}"}),))
    start_executor(procs, env, "executor-steady")
    frozen = start_executor(procs, env, "executor-frozen", **{FAILPOINTS: "events.after_claim:stop"})
    events: list[int] = []

    def emit() -> None:
        row = db.execute("SELECT emit_event('frz.tick', %s) AS id", (Jsonb({"n": len(events)}),)).fetchone()
        events.append(row["id"])  # type: ignore[index]

    def held() -> list[dict[str, Any]]:
        """Events still waiting for their rule 2 s after they arrived (database clock): a
        pass enforces one within milliseconds (NOTIFY, or the 0.2 s poll)."""
        return db.execute("SELECT e.id, now() - e.received AS waiting FROM event_pending p JOIN event e "
                          "ON e.id = p.event WHERE e.received < now() - interval '2 s'").fetchall()  # fmt: skip

    # BOUND seconds into the freeze, the replica still stopped: nothing it held is still waiting.
    assert freeze_while(procs, frozen, "events.after_claim", emit, held) == []
    until(procs, lambda: db.execute("SELECT count(*) AS n FROM event_pending").fetchone() == {"n": 0}, timeout=30)
    rows = db.execute(
        "SELECT e.id, count(f.id)::int AS n FROM event e LEFT JOIN enforcement f ON f.event = e.id "
        "WHERE e.id = ANY(%s) GROUP BY e.id",
        (events,),
    ).fetchall()
    assert {r["id"]: r["n"] for r in rows} == dict.fromkeys(events, 1)  # each enforced once
    print(f"{len(events)} events; {BOUND:g}s into a {FREEZE:g}s freeze of a replica that held some, none waiting")
    assert frozen.returncode is None, frozen.logs()


def test_a_replica_frozen_inside_a_workflow_advancement(procs: Procs, db: Conn, env: dict[str, str]) -> None:
    register_all(db)
    start_worker(procs, env, "wa")
    start_executor(procs, env, "executor-steady")
    frozen = start_executor(procs, env, "executor-frozen", **{FAILPOINTS: "workflow.before_commit:stop"})
    made: dict[int, tuple[str, str]] = {}

    def request() -> None:
        ref, tag = FAST[len(made) % len(FAST)], f"w{len(made)}"
        made[request_execution(db, ref, {"tag": tag})] = (ref, tag)

    freeze_while(procs, frozen, "workflow.before_commit", request)
    all_ended(procs, db, list(made), timeout=60)
    check_workflows(db, made)  # each advanced exactly once: the outputs of a run without faults
    rows = db.execute("SELECT id, extract(epoch FROM ended - created)::float8 AS took FROM execution "
                      "WHERE id = ANY(%s)", (list(made),)).fetchall()  # fmt: skip
    took = max(r["took"] for r in rows)
    print(f"{len(made)} workflows, a replica frozen {FREEZE:g}s holding some: each ended within {took:.2f} s")
    assert took < BOUND, rows
    assert frozen.returncode is None, frozen.logs()


def test_a_replica_frozen_inside_a_sweep(procs: Procs, db: Conn, env: dict[str, str]) -> None:
    """The sweep's lock held by a frozen replica: the other replicas' sweeps skip theirs, so a
    worker killed meanwhile keeps its running execution until the lock is let go."""
    doomed_worker = start_worker(procs, env, "wa")
    start_executor(procs, env, "executor-steady")
    eid = request_execution(db, "core.sleep", {"seconds": 120})
    until(procs, lambda: db.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone()
          == {"status": "running"}, timeout=30)  # fmt: skip
    frozen = start_executor(procs, env, "executor-frozen", **{FAILPOINTS: "recovery.after_sweep_lock:stop"})
    try:
        until(procs, lambda: "failpoint recovery.after_sweep_lock: SIGSTOP" in frozen.stderr(), timeout=30)
        stopped_at = time.monotonic()
        doomed_worker.kill()
        killed = db.execute("SELECT now() AS t").fetchone()["t"]  # type: ignore[index]

        def recovered() -> float | None:
            row = db.execute("SELECT status, extract(epoch FROM now() - %s)::float8 AS after FROM execution "
                             "WHERE id = %s", (killed, eid)).fetchone()  # fmt: skip
            return row["after"] if row and row["status"] != "running" else None  # type: ignore[index]

        # Within BOUND, the replica still stopped (FREEZE is twice as long).
        after = until(procs, recovered, timeout=BOUND)
        until(procs, lambda: time.monotonic() - stopped_at >= FREEZE, timeout=FREEZE, interval=0.5)
    finally:
        frozen.signal(signal.SIGCONT)
    print(f"a worker killed while a frozen replica held the sweep's lock: its execution recovered in {after:.2f} s")
    assert frozen.returncode is None, frozen.logs()
