"""Metrics against the real database: the gauges an executor refreshes from it, and the
counters the dead-worker sweep and the schedule-to-start monitor increment.

Counters are process-wide (prometheus_client's default registry), so tests compare
before and after."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from conveyor.config import Settings
from conveyor.executor import gauges
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.executor.recovery import Recovery
from conveyor.store.queries import Q
from conveyor.transport import messages as m
from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, Pool, add_worker, kill, request_one


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def count(name: str, **labels: str) -> float:
    return value(name, **labels) or 0.0


def move(conn: Conn, eid: int, to: str, worker: int | None = None) -> None:
    """Walk an execution along the status graph: requested -> scheduled -> running -> ended."""
    path = ["scheduling", "scheduled", "running", "completed"]
    for status in path[: path.index(to) + 1]:
        if status == "scheduled":
            conn.execute(
                "UPDATE execution SET status = 'scheduled', worker = %s, attempt = attempt + 1, scheduled = now() "
                "WHERE id = %s",
                (worker, eid),
            )
            conn.execute(
                "INSERT INTO execution_attempt (execution, attempt, worker, worker_name) "
                "SELECT id, attempt, worker, (SELECT name FROM worker WHERE id = %s) FROM execution WHERE id = %s",
                (worker, eid),
            )
        elif status == "running":
            conn.execute("UPDATE execution SET status = 'running', started = now() WHERE id = %s", (eid,))
        elif status == "completed":
            conn.execute("UPDATE execution SET status = 'completed', ended = now() WHERE id = %s", (eid,))
        else:
            conn.execute("UPDATE execution SET status = %s WHERE id = %s", (status, eid))


async def test_gauges_report_executions_workers_and_backlog_ages(conn: Conn, pool: Pool) -> None:
    fresh = add_worker(conn, "fresh")
    stale = add_worker(conn, "stale", heartbeat="now() - interval '1 hour'")
    add_worker(conn, "silent", heartbeat=None)  # active, never heartbeated: stale as well
    add_worker(conn, "draining", status="draining")
    add_worker(conn, "gone", status="inactive", heartbeat="now() - interval '1 day'")

    old_request = request_one(conn, "core.echo")
    conn.execute("UPDATE execution SET created = now() - interval '120 seconds' WHERE id = %s", (old_request,))
    request_one(conn, "core.echo")
    backing_off = request_one(conn)  # waits out a backoff: counted, but not waiting to be placed
    conn.execute(
        "UPDATE execution SET created = now() - interval '1 hour', not_before = now() + interval '1 hour' "
        "WHERE id = %s",
        (backing_off,),
    )
    scheduled = request_one(conn)
    move(conn, scheduled, "scheduled", fresh)
    conn.execute("UPDATE execution SET scheduled = now() - interval '400 seconds' WHERE id = %s", (scheduled,))
    move(conn, request_one(conn, "core.sleep"), "running", fresh)
    move(conn, request_one(conn, "core.echo"), "completed", fresh)

    gauges.GAUGES.clear()
    assert value("conveyor_workers", status="active") is None  # nothing measured, nothing exported
    await gauges.refresh(pool)

    assert value("conveyor_executions", status="requested", action="core.echo") == 2
    assert value("conveyor_executions", status="requested", action="core.noop") == 1
    assert value("conveyor_executions", status="scheduled", action="core.noop") == 1
    assert value("conveyor_executions", status="running", action="core.sleep") == 1
    assert value("conveyor_executions", status="running", action="core.echo") == 0  # zeros are there
    assert value("conveyor_executions", status="completed", action="core.echo") is None  # terminal: not a gauge

    assert value("conveyor_workers", status="active") == 3
    assert value("conveyor_workers", status="stale") == 2
    assert value("conveyor_workers", status="draining") == 1
    assert value("conveyor_workers", status="inactive") == 1

    assert (value("conveyor_worker_heartbeat_age_seconds", worker="fresh") or 0) < 5
    assert 3595 < (value("conveyor_worker_heartbeat_age_seconds", worker="stale") or 0) < 3700
    assert value("conveyor_worker_heartbeat_age_seconds", worker="draining") is not None
    assert value("conveyor_worker_heartbeat_age_seconds", worker="silent") is None  # no heartbeat, no age
    assert value("conveyor_worker_heartbeat_age_seconds", worker="gone") is None  # inactive

    assert 395 < (value("conveyor_scheduled_oldest_seconds") or 0) < 410
    assert 115 < (value("conveyor_requested_oldest_seconds") or 0) < 130

    # A snapshot replaces the previous one: a worker marked inactive leaves the
    # heartbeat series, and an empty backlog reads 0.
    conn.execute("UPDATE worker SET status = 'inactive' WHERE id = %s", (stale,))
    conn.execute("UPDATE execution SET status = 'requested', worker = NULL WHERE id = %s", (scheduled,))
    await gauges.refresh(pool)
    assert value("conveyor_worker_heartbeat_age_seconds", worker="stale") is None
    assert value("conveyor_workers", status="stale") == 1
    assert value("conveyor_workers", status="inactive") == 2
    assert value("conveyor_scheduled_oldest_seconds") == 0
    assert value("conveyor_executions", status="scheduled", action="core.noop") == 0


async def test_empty_database_reads_zero(pool: Pool) -> None:
    await gauges.refresh(pool)
    assert value("conveyor_workers", status="active") == 0
    assert value("conveyor_scheduled_oldest_seconds") == 0
    assert value("conveyor_requested_oldest_seconds") == 0
    assert value("conveyor_executions", status="requested", action="core.noop") == 0


async def test_sweep_counts_recoveries_by_kind_and_worker_downtime(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    worker = add_worker(conn, "doomed")
    conn.execute(
        """UPDATE action SET metadata = metadata || '{"on_worker_lost": "abandon"}' WHERE ref = 'core.sleep'"""
    )
    requeued, abandoned, cancelled = request_one(conn), request_one(conn, "core.sleep"), request_one(conn)
    for eid in (requeued, abandoned, cancelled):
        move(conn, eid, "running", worker)
    conn.execute("UPDATE execution SET status = 'canceling' WHERE id = %s", (cancelled,))
    handed_back = request_one(conn)
    move(conn, handed_back, "scheduled", worker)
    kill(conn, worker)

    kinds = ("handed_back", "requeued", "abandoned", "cancelled")
    before = {k: count("conveyor_recoveries_total", kind=k) for k in kinds}
    downtimes = count("conveyor_worker_downtime_seconds_count")
    downtime_sum = count("conveyor_worker_downtime_seconds_sum")

    result = await Recovery(pool, Settings()).sweep()

    assert result == {"dead": 1, "handed_back": 1, "requeued": 1, "ended": 2}
    assert {k: count("conveyor_recoveries_total", kind=k) - before[k] for k in kinds} == dict.fromkeys(kinds, 1)
    assert count("conveyor_worker_downtime_seconds_count") - downtimes == 1
    assert 3595 < count("conveyor_worker_downtime_seconds_sum") - downtime_sum < 3700

    # Nothing left to recover: nothing counted.
    again = await Recovery(pool, Settings()).sweep()
    assert again == {"dead": 0, "handed_back": 0, "requeued": 0, "ended": 0}
    assert count("conveyor_recoveries_total", kind="requeued") - before["requeued"] == 1


async def test_schedule_to_start_monitor_counts_scheduled_timeouts(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    worker = add_worker(conn, "idle")
    overdue = [request_one(conn) for _ in range(2)]
    for eid in overdue:
        move(conn, eid, "scheduled", worker)
    conn.execute("UPDATE execution SET scheduled = now() - interval '1 hour' WHERE id = ANY(%s)", (overdue,))
    move(conn, request_one(conn), "scheduled", worker)  # recent: not a timeout

    before = count("conveyor_execution_timeouts_total", kind="scheduled")
    result = await Recovery(pool, Settings()).check_scheduled_timeouts()
    assert result == {"rescheduled": 2, "failed": 0}
    assert count("conveyor_execution_timeouts_total", kind="scheduled") - before == 2


@pytest.mark.parametrize("attempt", [1, 2])
async def test_claim_reports_time_since_request(conn: Conn, attempt: int) -> None:
    """The worker's claim returns the request-to-start time the latency histogram observes
    (first attempts only)."""
    from conveyor.store.queries import Q
    from conveyor.store.rows import ClaimedRun
    from conveyor.worker.instrument import observe_claims

    worker = add_worker(conn, "claimer")
    eid = request_one(conn)
    conn.execute("UPDATE execution SET created = now() - interval '3 seconds' WHERE id = %s", (eid,))
    move(conn, eid, "scheduled", worker)
    conn.execute("UPDATE execution SET attempt = %s WHERE id = %s", (attempt, eid))
    conn.execute("UPDATE execution_attempt SET attempt = %s WHERE execution = %s", (attempt, eid))

    before = count("conveyor_scheduling_latency_seconds_count")
    total = count("conveyor_scheduling_latency_seconds_sum")
    rows = conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 10}).fetchall()
    assert [r["id"] for r in rows] == [eid]
    assert 2.9 < rows[0]["since_request"] < 10
    observe_claims([ClaimedRun(**r) for r in rows])
    observed = count("conveyor_scheduling_latency_seconds_count") - before
    assert observed == (1 if attempt == 1 else 0)
    if attempt == 1:
        assert 2.9 < count("conveyor_scheduling_latency_seconds_sum") - total < 10


async def test_admission_gauges_count_slots_and_waiters_per_policy(conn: Conn, pool: Pool) -> None:
    conn.execute(Q["set_policy"], {"target": "core.echo", "concurrency": 1, "parameters": [], "method": "enqueue"})
    first, *waiting = (request_one(conn, "core.echo") for _ in range(3))
    conn.execute("UPDATE execution_admission_queue SET enqueued = now() - interval '60 seconds'")
    await gauges.refresh(pool)
    assert value("conveyor_admission_slots_held", policy="core.echo") == 1
    assert value("conveyor_admission_queue_depth", policy="core.echo") == 2
    assert 59 < (value("conveyor_admission_oldest_wait_seconds", policy="core.echo") or 0) < 70

    move(conn, first, "completed", add_worker(conn, "w"))  # its slot goes to the next in line
    await gauges.refresh(pool)
    assert value("conveyor_admission_slots_held", policy="core.echo") == 1
    assert value("conveyor_admission_queue_depth", policy="core.echo") == 1
    assert len(waiting) == 2


async def test_dead_letter_metrics_count_by_reason_and_resolution(conn: Conn, pool: Pool, db_url: str) -> None:
    """Each handled dead letter is counted with its resolution and timed; the depth gauge
    is what waits for an operator (on PostgreSQL: the unresolved records)."""
    settings = Settings()
    handler = DeadLetterHandler(pool, PostgresTransport(db_url, "conveyor"), settings, "test-executor")
    finished = request_one(conn, "core.echo")
    move(conn, finished, "completed", add_worker(conn, "w"))
    stale_before = count("conveyor_dead_letters_total", reason="expired", resolution="stale")
    timed_before = count("conveyor_dead_letter_handler_seconds_count")

    def letter(n: int) -> m.DeadLetter:
        payload = {"execution_id": finished, "attempt": 1, "worker_id": 1, "scheduled": "2026-01-01T00:00:00+00:00"}
        return m.DeadLetter(
            dedupe_key=f"metrics-{n}", message_id=f"metrics-{n}", transport="postgres",
            queue="conveyor.worker.1.executions", routing_key=m.Names.worker_key(1), reason="expired",
            body=m.encode(f"metrics-{n}", m.SCHEDULED, payload, datetime(2026, 1, 1, tzinfo=UTC)),
        )  # fmt: skip

    assert await handler.handle(letter(1)) == "stale"  # the execution moved on long ago
    assert count("conveyor_dead_letters_total", reason="expired", resolution="stale") == stale_before + 1
    assert count("conveyor_dead_letter_handler_seconds_count") == timed_before + 1

    await handler.record_unresolved(letter(2).as_poison("handler kept failing"))
    await handler.refresh_gauges()
    assert value("conveyor_dlq_depth") == 1  # the poison one waits for an operator
    assert value("conveyor_dead_letter_records") == 2
