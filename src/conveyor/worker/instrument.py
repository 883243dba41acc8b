"""Worker metrics, observed from what the worker already has at hand: the rows of its
claims and the results it queues (definitions in ``conveyor/ops/metrics.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conveyor.ops.metrics import EXECUTION_DURATION, EXECUTION_TIMEOUTS, SCHEDULING_LATENCY
from conveyor.store.rows import ClaimedRun


def observe_claims(rows: Iterable[ClaimedRun]) -> None:
    """Scheduling latency (request -> running, database clock) of freshly claimed rows.

    First attempts only: for a re-run (retry or lost worker) the time since the
    request includes the earlier attempts and their backoffs, which is not latency.
    Rows without ``since_request`` (claims recovered by ``unknown_claims``) are skipped."""
    for row in rows:
        if row.since_request is not None and row.attempt == 1:
            SCHEDULING_LATENCY.observe(max(0.0, float(row.since_request)))


def observe_result(action: str | None, outcome: str, result: dict[str, Any]) -> None:
    """Run time of one attempt by action and outcome, and execution timeouts. A result
    without a duration (a cancellation) is not a run time."""
    if outcome == "timeout":
        EXECUTION_TIMEOUTS.labels("execution").inc()
    duration = result.get("duration")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        EXECUTION_DURATION.labels(action or "unknown", outcome).observe(max(0.0, float(duration)))
