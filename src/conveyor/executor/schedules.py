"""Firing schedule slots (issue #13): each slot exactly once across all replicas.

A pass, in one transaction: pick the due schedules (``next_fire <= now()``) FOR UPDATE
SKIP LOCKED, decide each one's slots with the pure ``conveyor.domain.schedules.plan``
(the database's now, the previous run still going, a buffered slot), and apply the
decision with ``fire_schedules`` -- set-based since migration 0021: every slot row of
the pass in one INSERT ON CONFLICT DO NOTHING, their executions in one INSERT, refusals
per slot ('request_error'), overlap, next_fire. Then the loop sleeps until the earliest next_fire, asked of
the database -- so a slot fires within milliseconds of its time -- capped by
schedules.poll_interval and cut short by a schedule change (Topic.SCHEDULE).

Failpoints (all inside the pass's transaction unless said): ``schedules.after_slot_row``
(a schedule's slot rows written, not committed), ``schedules.before_commit`` (every due
schedule decided), ``schedules.after_commit`` (committed; metrics not yet counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from psycopg.types.json import Jsonb

from conveyor.domain import schedules as sch
from conveyor.ops import failpoints
from conveyor.ops.metrics import SCHEDULE_LAG, SCHEDULE_SLOTS
from conveyor.store.db import Pool, Row
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)

# When a due schedule is held by another replica (it is firing it, or died holding it),
# try again this soon rather than spin: the holder commits in milliseconds, and a killed
# holder's transaction is rolled back as soon as its connection drops.
RETRY_LOCKED = 0.02
# While a buffered slot waits (buffer_one), how often to look whether the run it waits
# for has ended: a fraction of a second, and only then -- cheaper than hearing every
# completion of the installation on every executor.
BUFFERED_POLL = 0.25


@dataclass(frozen=True)
class PassResult:
    picked: int  # due schedules decided
    slots: int  # slot rows written
    full: bool  # a full batch, or a schedule with more slots than one pass decides


class Firer:
    def __init__(self, pool: Pool, *, batch_size: int) -> None:
        self._pool = pool
        self._batch = batch_size
        self.waiting = 0  # buffered slots still waiting after the last release_buffered

    async def run_pass(self) -> PassResult:
        written: list[Row] = []
        more = False
        async with self._pool.connection() as conn, conn.transaction():
            due = await (await conn.execute(Q["pick_due_schedules"], {"limit": self._batch})).fetchall()
            names = {row["id"]: row["name"] for row in due}
            batch: list[dict[str, Any]] = []
            for row in due:
                try:
                    decided = _decide(row)
                except sch.InvalidScheduleError as exc:  # a stored row the domain refuses (a zone removed)
                    log.error("schedule cannot be fired; paused", schedule=row["name"], error=str(exc))
                    await conn.execute("SELECT pause_schedule(%s)", (row["name"],))
                    continue
                batch.append(decided)
                more = more or plan_due(decided, row["now"])
            if batch:
                rows = await (await conn.execute(Q["fire_schedules"], {"batch": Jsonb(batch)})).fetchall()
                written.extend({**r, "name": names.get(r["schedule"], "?")} for r in rows)
                if rows:
                    failpoints.reach("schedules.after_slot_row")
            failpoints.reach("schedules.before_commit")
        failpoints.reach("schedules.after_commit")
        _count(written)
        return PassResult(len(due), len(written), more or len(due) >= self._batch)

    async def release_buffered(self) -> int:
        """buffer_one: fire the waiting slots whose previous run has ended."""
        released: list[Row] = []
        async with self._pool.connection() as conn, conn.transaction():
            waiting = await (await conn.execute(Q["buffered_schedules"], {"limit": self._batch})).fetchall()
            for row in waiting:
                rows = await (await conn.execute(Q["release_buffered_slot"], {"id": row["id"]})).fetchall()
                released.extend({**r, "name": row["name"]} for r in rows)
        self.waiting = len(waiting) - len(released)
        for r in released:
            SCHEDULE_SLOTS.labels(r["outcome"]).inc()
            log.info(
                "buffered schedule slot fired",
                schedule=r["name"],
                slot=r["slot"].isoformat(),
                outcome=r["outcome"],
                execution_id=r["execution"],
            )
        return len(released)

    async def until_next(self, poll: float) -> float:
        """Seconds to sleep: until the earliest next_fire (database clock), at most ``poll``."""
        async with self._pool.connection() as conn:
            row = await (await conn.execute(Q["next_schedule_fire"])).fetchone()
        wait = row["wait"] if row else None
        if wait is None:
            return poll
        if wait <= 0:  # due, but another replica holds it (or it just became due)
            return min(poll, RETRY_LOCKED)
        # A floor: the event loop's timer may fire a hair early; the next pass then finds
        # nothing and this comes round again with the remainder.
        return max(0.001, min(poll, float(wait)))


def _decide(row: Row) -> dict[str, Any]:
    spec = sch.Spec.from_row(row)
    after = sch.first_after(spec, row["last_slot"], row["updated"])
    plan = sch.plan(
        spec,
        after,
        row["now"],
        running=row["running"],
        buffered=bool(row["buffered"]),
        emits=row["action_ref"] is None,
        last_slot=row["last_slot"],
    )
    decisions = [{"slot": d.slot.isoformat(), "origin": d.origin, "action": d.action} for d in plan.decisions]
    return {
        "id": row["id"],
        "decisions": decisions,
        "cancel": plan.cancel,
        "next_fire": _iso(plan.next_fire),
        "last_slot": _iso(plan.last_slot),
    }


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def _count(written: list[Row]) -> None:
    for r in written:
        SCHEDULE_SLOTS.labels(r["outcome"]).inc()
        if r["outcome"] == "missed":
            log.warning("schedule slot missed", schedule=r["name"], slot=r["slot"].isoformat())
            continue
        if r["outcome"] in ("requested", "emitted", "request_error"):
            SCHEDULE_LAG.observe(max(0.0, (r["fired"] - r["slot"]).total_seconds()))
        log.info(
            "schedule slot fired",
            schedule=r["name"],
            slot=r["slot"].isoformat(),
            origin=r["origin"],
            outcome=r["outcome"],
            execution_id=r["execution"],
            event_id=r["event"],
            error=r["error"],
        )


def plan_due(decided: dict[str, Any], now: datetime) -> bool:
    """The schedule is still due after this pass (it had more slots than one pass decides)."""
    return decided["next_fire"] is not None and datetime.fromisoformat(decided["next_fire"]) <= now
