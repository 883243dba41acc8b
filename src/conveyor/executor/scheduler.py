"""One scheduling round: claim (requested -> scheduling), validate, place, dispatch
(scheduling -> scheduled) or hand back / fail. Every write is guarded on status and
on this executor's claim, so rounds on any number of replicas cannot collide.

Workflows (runner type ``workflow``) and inquiries (core.ask, runner type ``inquiry``)
need no worker: they are claimed whatever the free capacity, validated like the rest, and
started (scheduling -> running, with their workflow state) or asked (scheduling ->
pending, with their inquiry) in the dispatch transaction."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from psycopg import AsyncCursor
from psycopg.rows import class_row

from conveyor.domain import parameters
from conveyor.domain.inquiries import ask_problems
from conveyor.domain.placement import Claim, place
from conveyor.ops import failpoints
from conveyor.store.db import AsyncConn, Pool, Row
from conveyor.store.queries import Q
from conveyor.store.rows import ClaimedExecution, LiveWorker

log = structlog.get_logger(__name__)
T = TypeVar("T")

NO_WORKERS = "no workers available: no live worker offers action {ref}"
INQUIRY = "inquiry"  # the runner type of core.ask
WORKFLOW = "workflow"


@dataclass(frozen=True, slots=True)
class RoundResult:
    claimed: int
    dispatched: int
    failed: int
    handed_back: int
    asked: int = 0  # inquiries asked (scheduling -> pending)
    # A claim came back full (batch_size rows): more may wait. A claim cut short by the
    # free capacity is not: the next round would only find the workers full again.
    more: bool = False


class Scheduler:
    def __init__(
        self,
        pool: Pool,
        *,
        executor_id: str,
        batch_size: int,
        no_worker_grace: float,
        unplaceable_check_interval: float = 1.0,
        workflow_max_depth: int = 10,
    ) -> None:
        self._pool = pool
        self._executor_id = executor_id
        self._batch_size = batch_size
        self._grace = no_worker_grace
        self._unplaceable_check_interval = unplaceable_check_interval
        self._workflow_max_depth = workflow_max_depth
        self._next_unplaceable_check = 0.0
        self._full = False  # the last claim filled a batch
        self._validators: dict[tuple[str, Any], parameters.Problems] = {}

    async def run_round(self) -> RoundResult:
        # Pipelined: statements that do not need an earlier result travel together, so
        # a round costs four round trips to the server however many rows it moves.
        async with self._pool.connection() as conn, conn.pipeline():
            rows = await self._claim(conn)
            if not rows:
                return RoundResult(0, 0, 0, 0)
            failpoints.reach("scheduler.after_claim")
            failures: dict[int, str] = {}
            claims: list[Claim] = []
            workflows: list[int] = []
            asking: list[int] = []
            for row in rows:
                problem = self._invalid(row)
                if problem:
                    failures[row.id] = problem
                elif row.runner_type == WORKFLOW:
                    workflows.append(row.id)  # started here, on no worker
                elif row.runner_type == INQUIRY:
                    asking.append(row.id)
                else:
                    claims.append(row.claim())
            dispatched, failed, released, asked = await self._dispatch(conn, claims, failures, workflows, asking)
            if dispatched:
                failpoints.reach("scheduler.after_dispatch")
        for eid, error in failures.items():
            log.warning("execution failed before dispatch", execution_id=eid, error=error)
        return RoundResult(len(rows), dispatched, failed, released, asked, more=self._full)

    async def _claim(self, conn: AsyncConn) -> list[ClaimedExecution]:
        """requested -> scheduling, committed without waiting for the WAL flush."""
        async with conn.transaction():
            await conn.execute(Q["relaxed_commit"])
            workers = await _fetch(conn, LiveWorker, Q["live_workers"])
            open_ = [w for w in workers if w.accepting and w.free > 0]
            free = sum(w.free for w in open_)
            # Only what a worker with a free slot can run now (so a backlog for a full
            # worker cannot block other actions), at most as many as there are free
            # slots; plus, separately, what no live worker can run at all once past the
            # grace, to fail it.
            claiming = None
            if free:
                params = {
                    "limit": min(self._batch_size, free),
                    "executor": self._executor_id,
                    "refs": sorted({r for w in open_ for r in w.actions}),
                    "runtimes": sorted({r for w in open_ for r in w.runtimes}),
                }
                claiming = conn.cursor(row_factory=class_row(ClaimedExecution))
                await claiming.execute(Q["claim_requested"], params)
            # Workflows and inquiries, whatever the workers: only the executor runs them.
            # Picked (and locked) in the same round trip; claimed only when there are some.
            picked = await conn.execute(Q["pick_executor_run"], {"limit": self._batch_size})
            rows: list[ClaimedExecution] = list(await claiming.fetchall()) if claiming else []
            ids = [r["id"] for r in await picked.fetchall()]
            self._full = len(rows) >= self._batch_size or len(ids) >= self._batch_size
            if ids:
                rows += await _fetch(
                    conn, ClaimedExecution, Q["claim_executor_run"], {"ids": ids, "executor": self._executor_id}
                )
            # The unplaceable query scans the whole backlog: run it only every so often.
            if time.monotonic() >= self._next_unplaceable_check:
                self._next_unplaceable_check = time.monotonic() + self._unplaceable_check_interval
                unplaceable = await self._claim_unplaceable(conn, workers)
                self._full = self._full or len(unplaceable) >= self._batch_size
                rows += unplaceable
        return rows

    async def _dispatch(
        self, conn: AsyncConn, claims: list[Claim], failures: dict[int, str], workflows: list[int], asking: list[int]
    ) -> tuple[int, int, int, int]:
        """Place claims (scheduling -> scheduled), start workflows (-> running), ask
        inquiries (-> pending), fail or hand back the rest, in one transaction."""
        async with conn.transaction():
            await conn.execute(Q["relaxed_commit"])
            await conn.execute(Q["lock_assignment"])
            live = await _fetch(conn, LiveWorker, Q["live_workers"])
            placement = place(claims, [w.candidate() for w in live])
            by_id = {c.id: c for c in claims}
            release = list(placement.no_capacity)
            for eid in placement.no_worker:
                if by_id[eid].age >= self._grace:
                    failures[eid] = NO_WORKERS.format(ref=by_id[eid].action_ref)
                else:
                    release.append(eid)
            assigned = failed = released = asked = None
            if placement.assigned:
                ids, worker_ids = zip(*placement.assigned, strict=True)
                params = {"ids": list(ids), "workers": list(worker_ids), "executor": self._executor_id}
                assigned = await conn.execute(Q["assign"], params)
            if asking:
                # An inquiry is announced to people: it must not vanish in a crash.
                await conn.execute(Q["durable_commit"])
                asked = await conn.execute(Q["ask_inquiries"], {"ids": asking, "executor": self._executor_id})
            if failures:
                # A failure is reported to waiters: it must not be undone by a crash.
                await conn.execute(Q["durable_commit"])
                params = {"ids": list(failures), "errors": list(failures.values()), "executor": self._executor_id}
                failed = await conn.execute(Q["fail_claims"], params)
            if release:
                released = await conn.execute(Q["release_claims"], {"ids": release, "executor": self._executor_id})
            started = None
            if workflows:
                start: dict[str, Any] = {
                    "ids": workflows,
                    "executor": self._executor_id,
                    "max_depth": self._workflow_max_depth,
                }
                started = await conn.execute(Q["start_workflows"], start)
        ran, broke = await _started(started)
        return await _count(assigned) + ran, await _count(failed) + broke, await _count(released), await _count(asked)

    async def _claim_unplaceable(self, conn: AsyncConn, workers: list[LiveWorker]) -> list[ClaimedExecution]:
        params = {
            "limit": self._batch_size,
            "executor": self._executor_id,
            "refs": sorted({r for w in workers for r in w.actions}),
            "runtimes": sorted({r for w in workers for r in w.runtimes}),
            "grace": self._grace,
        }
        return await _fetch(conn, ClaimedExecution, Q["claim_unplaceable"], params)

    def _invalid(self, row: ClaimedExecution) -> str | None:
        key = (row.action_ref, row.action_updated)
        problems_of = self._validators.get(key)
        if problems_of is None:
            problems_of = self._validators[key] = parameters.checker(row.parameters_schema, root="(root)")
        problems = problems_of(row.parameters)
        if not problems and row.runner_type == INQUIRY:
            problems = ask_problems(row.parameters)
        return "invalid parameters: " + "; ".join(problems) if problems else None

    async def reclaim_stale(self, older_than: float) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            rows = await (await conn.execute(Q["reclaim_stale_claims"], {"older_than": older_than})).fetchall()
        for row in rows:
            log.warning(
                "reclaimed a stale scheduling claim",
                execution_id=row["id"],
                attempt=row["attempt"],
                executor=row["executor"],
            )
        return len(rows)

    async def release_gone_claims(self) -> int:
        """Claims of executors whose liveness session is gone (killed, or frozen past
        executor_liveness.frozen_after): back to requested now (executor/liveness.py)."""
        async with self._pool.connection() as conn, conn.transaction():
            rows = await (await conn.execute(Q["release_gone_executor_claims"])).fetchall()
        for row in rows:
            log.warning(
                "released a claim of an executor that is gone",
                execution_id=row["id"],
                attempt=row["attempt"],
                executor=row["executor"],
            )
        return len(rows)

    async def repair_admission(self) -> int:
        """Admit waiters of groups with a free slot that the triggers did not promote
        (see admission_repair); returns how many, normally 0. Then forget idle groups."""
        async with self._pool.connection() as conn:
            async with conn.transaction():
                row = await (await conn.execute(Q["admission_repair"])).fetchone()
                admitted = int(row["admitted"]) if row else 0
            async with conn.transaction():
                await conn.execute(Q["admission_cleanup"])
        if admitted:
            log.warning("admitted waiters the admission triggers had left waiting", admitted=admitted)
        return admitted


async def _fetch(conn: AsyncConn, cls: type[T], query: str, params: dict[str, Any] | None = None) -> list[T]:
    """The rows of ``query`` as ``cls`` instances (typed rows on the hot path)."""
    cursor = conn.cursor(row_factory=class_row(cls))
    await cursor.execute(query, params)
    return list(await cursor.fetchall())


async def _started(cursor: AsyncCursor[Row] | None) -> tuple[int, int]:
    """Workflows started (running) and failed at start (too deep, deleted)."""
    if cursor is None:
        return 0, 0
    rows = await cursor.fetchall()
    for row in rows:
        if row["status"] == "failed":
            log.warning("workflow failed at start", execution_id=row["id"], error=row["error"])
    failed = sum(1 for row in rows if row["status"] == "failed")
    return len(rows) - failed, failed


async def _count(cursor: AsyncCursor[Row] | None) -> int:
    return len(await cursor.fetchall()) if cursor is not None else 0
