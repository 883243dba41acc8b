"""Gauges of shared state, read from the database by each executor (the duty
``ExecutorService._refresh_gauges``, every ``executor.metrics_interval``):

- ``conveyor_executions{status,action}``: executions not finished yet, per non-terminal
  status and action (zeros included);
- ``conveyor_workers{status}``: action workers ``active``, ``draining``, ``inactive``, and
  ``stale`` (active, heartbeat older than its ``stale_after``: dead but not swept yet);
- ``conveyor_worker_heartbeat_age_seconds{worker}``: per worker not marked inactive;
- ``conveyor_scheduled_oldest_seconds`` and ``conveyor_requested_oldest_seconds``: age of
  the oldest execution dispatched but not started, and waiting to be placed;
- ``conveyor_admission_slots_held{policy}``, ``conveyor_admission_queue_depth{policy}`` and
  ``conveyor_admission_oldest_wait_seconds{policy}``: per admission policy (telemetry
  derived from the admission tables, never consulted for a decision);
- ``conveyor_events_pending`` and ``conveyor_events_pending_oldest_seconds``: events whose
  rules are not evaluated yet (event_pending) and the oldest one's wait;
  ``conveyor_schedules{state}`` (paused, active) and ``conveyor_schedules_overdue``: active
  schedules whose next_fire is more than 1 s past (issue #13).

Ages use the database clock. Each refresh replaces the whole snapshot, so a worker that
left drops out of the heartbeat series. The collector exports nothing until this process
refreshed once: workers and API processes do not report zeros they never measured.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric

from conveyor.domain.status import WorkerStatus
from conveyor.store.db import Pool, Row
from conveyor.store.queries import Q

# The worker statuses, plus "stale": active by its row, but past its heartbeat bound.
WORKER_STATUSES = (*(s.value for s in WorkerStatus), "stale")


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        "executions": GaugeMetricFamily(
            "conveyor_executions",
            "Executions not finished yet, by status (requested, scheduling, scheduled, running, pending, paused,"
            " canceling) and action",
            labels=["status", "action"],
        ),
        "workers": GaugeMetricFamily(
            "conveyor_workers",
            "Action workers by status; stale = active with a heartbeat older than its stale_after (not swept yet)",
            labels=["status"],
        ),
        "heartbeat_age": GaugeMetricFamily(
            "conveyor_worker_heartbeat_age_seconds",
            "Seconds since the last heartbeat of each worker not marked inactive (database clock)",
            labels=["worker"],
        ),
        "scheduled_oldest": GaugeMetricFamily(
            "conveyor_scheduled_oldest_seconds",
            "Age of the oldest execution dispatched to a worker but not started (0 when none)",
        ),
        "requested_oldest": GaugeMetricFamily(
            "conveyor_requested_oldest_seconds",
            "Age of the oldest execution waiting to be placed, not counting a backoff or admission (0 when none)",
        ),
        "admission_held": GaugeMetricFamily(
            "conveyor_admission_slots_held",
            "Concurrency slots held by executions admitted under each admission policy",
            labels=["policy"],
        ),
        "admission_waiting": GaugeMetricFamily(
            "conveyor_admission_queue_depth",
            "Executions waiting for a slot of each admission policy (method enqueue)",
            labels=["policy"],
        ),
        "admission_oldest": GaugeMetricFamily(
            "conveyor_admission_oldest_wait_seconds",
            "How long the longest-waiting execution of each admission policy has waited (0 when none)",
            labels=["policy"],
        ),
        **_automation_families(),
    }


def _automation_families() -> dict[str, GaugeMetricFamily]:
    return {
        "events_pending": GaugeMetricFamily(
            "conveyor_events_pending", "Events waiting for their rules to be evaluated (event_pending)"
        ),
        "events_pending_oldest": GaugeMetricFamily(
            "conveyor_events_pending_oldest_seconds",
            "How long the oldest event waiting for its rules has waited (0 when none)",
        ),
        "schedules": GaugeMetricFamily("conveyor_schedules", "Schedules, paused or active", labels=["state"]),
        "schedules_overdue": GaugeMetricFamily(
            "conveyor_schedules_overdue",
            "Active schedules whose next fire time is more than 1 s past (no executor is firing them)",
        ),
    }


class DatabaseGauges:
    """A Prometheus collector serving the last snapshot read from the database."""

    def __init__(self) -> None:
        self._snapshot: list[Metric] = []

    def describe(self) -> Iterable[Metric]:
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        return list(self._snapshot)

    def publish(
        self,
        executions: Iterable[Row],
        workers: Row,
        heartbeats: Iterable[Row],
        backlog: Row,
        admission: Iterable[Row] = (),
        automation: Row | None = None,
    ) -> None:
        """Replace the snapshot with rows of the ``metrics.sql`` queries."""
        f = _families()
        for row in executions:
            f["executions"].add_metric([row["status"], row["action"]], row["count"])
        for status in WORKER_STATUSES:
            f["workers"].add_metric([status], workers[status])
        for row in heartbeats:
            f["heartbeat_age"].add_metric([row["name"]], row["age"])
        f["scheduled_oldest"].add_metric([], backlog["scheduled_oldest"])
        f["requested_oldest"].add_metric([], backlog["requested_oldest"])
        for row in admission:
            f["admission_held"].add_metric([row["policy"]], row["held"])
            f["admission_waiting"].add_metric([row["policy"]], row["waiting"])
            f["admission_oldest"].add_metric([row["policy"]], row["oldest_wait"])
        if automation is not None:
            f["events_pending"].add_metric([], automation["events_pending"])
            f["events_pending_oldest"].add_metric([], automation["events_pending_oldest"])
            f["schedules"].add_metric(["paused"], automation["schedules_paused"])
            f["schedules"].add_metric(["active"], automation["schedules_active"])
            f["schedules_overdue"].add_metric([], automation["schedules_overdue"])
        self._snapshot = list(f.values())

    def clear(self) -> None:
        self._snapshot = []


GAUGES = DatabaseGauges()
REGISTRY.register(GAUGES)


async def refresh(pool: Pool) -> None:
    """Read the gauges from the database (one connection, one snapshot) and publish them."""
    async with pool.connection() as conn, conn.transaction():
        # One snapshot: every statement sees the same data and the same now().
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        executions = await (await conn.execute(Q["execution_gauges"])).fetchall()
        workers = await (await conn.execute(Q["worker_gauges"])).fetchone()
        heartbeats = await (await conn.execute(Q["worker_heartbeat_ages"])).fetchall()
        backlog = await (await conn.execute(Q["backlog_ages"])).fetchone()
        admission = await (await conn.execute(Q["admission_gauges"])).fetchall()
        automation = await (await conn.execute(Q["automation_gauges"])).fetchone()
    assert workers is not None
    assert backlog is not None
    GAUGES.publish(executions, workers, heartbeats, backlog, admission, automation)
