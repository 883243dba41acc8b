"""Recovery loops, safe on every replica at once (every write is guarded):

- the sweep: dead workers marked inactive (stale heartbeat, or liveness lock gone), their
  scheduled work handed back, their running work run again or abandoned per policy;
- the watch: a cheap query, asked often, that starts a sweep at once when a worker's
  liveness session has left pg_stat_activity -- a killed worker is judged within one
  watch interval, not one sweep interval plus lock_grace;
- the schedule-to-start monitor: scheduled work never started is moved to another
  worker a bounded number of times, then failed with the seeds' message.
"""

from __future__ import annotations

import asyncio

import structlog

from conveyor.config import Settings
from conveyor.domain.outcome import (
    NOT_PICKED_UP_ERROR,
    WORKER_LOST_ERROR,
    AttemptEnd,
    after_missed_dispatch,
    after_worker_lost,
)
from conveyor.domain.policy import WorkerLostPolicy
from conveyor.domain.status import ExecutionStatus, InactiveReason
from conveyor.ops import failpoints
from conveyor.ops.metrics import EXECUTION_TIMEOUTS, RECOVERIES, WORKER_DOWNTIME
from conveyor.store import transitions
from conveyor.store.db import Pool, Row
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions

log = structlog.get_logger(__name__)
S = ExecutionStatus

# The watch's quick second looks after a sweep that found a session of the process left.
_RECHECKS = 3
_RECHECK_DELAY = 0.02

# (Kept importable from here: the attempts' errors, defined with the decisions.)
WORKER_LOST = WORKER_LOST_ERROR
NOT_PICKED_UP = NOT_PICKED_UP_ERROR


class Recovery:
    def __init__(self, pool: Pool, settings: Settings) -> None:
        self._pool = pool
        cfg = settings.recovery
        self._lost_policy = WorkerLostPolicy(
            on_worker_lost=cfg.on_worker_lost,
            max_attempts=cfg.worker_lost_max_attempts,
            backoff_base=cfg.backoff_base,
            backoff_max=cfg.backoff_max,
        )
        self._scheduled_timeout = settings.executor.scheduled_timeout
        self._reschedules = settings.executor.scheduled_timeout_reschedules

    async def sweep(self) -> dict[str, int]:
        """One pass over dead workers and what they held. Returns counts for logs and tests."""
        async with self._pool.connection() as conn, conn.transaction():
            if not (await (await conn.execute(Q["lock_sweep"])).fetchone() or {}).get("locked"):
                return {}
            failpoints.reach("recovery.after_sweep_lock")  # the other replicas' sweeps skip theirs now
            await conn.execute(Q["note_lost_locks"])
            dead = await (await conn.execute(Q["deactivate_dead_workers"])).fetchall()
            back = await transitions.hand_back_scheduled(conn, None)
            lost = await (await conn.execute(Q["lost_running"])).fetchall()
            decisions = Decisions()
            for row in lost:
                was = ExecutionStatus(row["status"])
                decisions.add(row, after_worker_lost(was, row["lost_before"], self._lost_policy, row["metadata"]))
            moved = []
            if decisions.ids:
                params = decisions.params(AttemptEnd.WORKER_LOST, by="recovery", from_statuses=(S.RUNNING, S.CANCELING))
                moved = await transitions.resolve_attempts(conn, params)
        requeued = [m["id"] for m in moved if m["status"] == S.REQUESTED]
        ended = [m["id"] for m in moved if m["status"] != S.REQUESTED]
        _count_sweep(dead, back, moved)
        for w in dead:
            age = w["heartbeat_age"]
            # The statement decided why (worker.inactive_reason): the log line says it in words.
            if w["reason"] == InactiveReason.PROCESS_GONE:
                reason = f"liveness lock released: process gone, no session left (last heartbeat {age:.1f}s ago)"
            elif w["reason"] == InactiveReason.LOCK_LOST:
                reason = (
                    f"liveness lock released: process gone, lock not re-taken within its lock_grace "
                    f"(last heartbeat {age:.1f}s ago)"
                )
            else:
                reason = f"heartbeat is stale ({age:.0f}s old)" if age is not None else "never sent a heartbeat"
            log.warning(
                f"Worker {w['name']} (ID: {w['id']}) {reason}, marking as inactive",
                worker=w["name"],
                worker_id=w["id"],
                heartbeat_age=round(age, 3) if age is not None else None,
                inactive_reason=w["reason"],
            )
        stale = sum(1 for w in dead if not w["lock_lost"])  # the seeds' summary line counts these
        if stale:
            log.info(f"Deactivated {stale} worker(s) with stale heartbeats", count=stale)
        if len(dead) > stale:
            log.info(f"Deactivated {len(dead) - stale} worker(s) whose process is gone", count=len(dead) - stale)
        for b in back:
            log.info(
                "handed back scheduled execution of a lost worker",
                execution_id=b["id"],
                attempt=b["attempt"],
                worker=b["worker_name"],
                worker_id=b["worker"],
            )
        by_id = {row["id"]: row for row in lost}
        for m in moved:
            held = by_id[m["id"]]
            log.warning(
                "recovered execution from a lost worker",
                execution_id=m["id"],
                attempt=held["attempt"],
                worker=held["worker_name"],
                worker_id=held["worker"],
                status=m["status"],
            )
        return {"dead": len(dead), "handed_back": len(back), "requeued": len(requeued), "ended": len(ended)}

    async def watch(self) -> dict[str, int]:
        """Sweep now if an active worker's liveness session is gone (it died, or its
        session alone dropped: the sweep tells which); else nothing. One cheap statement
        per call when all is well: what makes a frequent recovery.watch_interval
        affordable. A killed process's backends end one by one, the liveness one often
        some milliseconds before the pool's (up to ~20 ms measured on a loaded machine):
        a sweep that came in between found a session left, so look again shortly rather
        than a whole interval later. (A liveness session dropped alone costs these few
        extra sweeps per interval until its worker takes its lock again.)"""
        result: dict[str, int] = {}
        for attempt in range(_RECHECKS + 1):
            if attempt:
                await asyncio.sleep(_RECHECK_DELAY)
            async with self._pool.connection() as conn:
                row = await (await conn.execute(Q["liveness_missing"])).fetchone()
            if not (row and row["missing"]):
                break
            swept = await self.sweep()
            result = {k: result.get(k, 0) + swept.get(k, 0) for k in {*result, *swept}}
            if swept.get("dead"):
                break
        return result

    async def check_scheduled_timeouts(self) -> dict[str, int]:
        """Scheduled but never started within the schedule-to-start timeout: move it to
        another worker up to ``scheduled_timeout_reschedules`` times, then fail it."""
        async with self._pool.connection() as conn, conn.transaction():
            overdue = await (
                await conn.execute(Q["overdue_scheduled"], {"default_timeout": self._scheduled_timeout})
            ).fetchall()
            if not overdue:
                return {}
            decisions = Decisions()
            for row in overdue:
                decisions.add(row, after_missed_dispatch(row["missed"], self._reschedules, NOT_PICKED_UP_ERROR))
            params = decisions.params(
                AttemptEnd.NOT_PICKED_UP, by="execution_timeout_monitor", from_statuses=(S.SCHEDULED,)
            )
            moved = await transitions.resolve_attempts(conn, params)
        failed = [m["id"] for m in moved if m["status"] == S.FAILED]
        EXECUTION_TIMEOUTS.labels("scheduled").inc(len(moved))
        by_id = {row["id"]: row for row in overdue}
        for m in moved:
            was = by_id[m["id"]]
            then = "marking as failed" if m["status"] == "failed" else "moving it to another worker"
            log.warning(
                f"Execution {m['id']} has been scheduled for too long, {then}",
                execution_id=m["id"],
                attempt=was["attempt"],
                worker=was["worker_name"],
                worker_id=was["worker"],
                status=m["status"],
            )
        return {"rescheduled": len(moved) - len(failed), "failed": len(failed)}


def _count_sweep(dead: list[Row], back: list[Row], moved: list[Row]) -> None:
    """Metrics of one sweep: recoveries by kind, and each dead worker's downtime (last
    heartbeat to marked inactive; a worker that never sent one has none)."""
    RECOVERIES.labels("handed_back").inc(len(back))
    for kind, status in (("requeued", S.REQUESTED), ("abandoned", S.ABANDONED), ("cancelled", S.CANCELLED)):
        RECOVERIES.labels(kind).inc(sum(1 for m in moved if m["status"] == status))
    for w in dead:
        if w["heartbeat_age"] is not None:
            WORKER_DOWNTIME.observe(max(0.0, w["heartbeat_age"]))
