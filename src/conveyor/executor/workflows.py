"""The executor's workflow duty: apply each workflow's pending events, exactly once.

Woken by the ``workflow`` topic (a child's end, a verb: cancel, pause, resume, rerun; a
start) and polled every ``workflow.poll_interval`` on every replica (the reconciler: a
replica killed mid-advancement leaves its events, which the next pass applies). A pass
takes up to ``workflow.batch_size`` workflows with pending events and advances them in
ONE transaction: their advisory locks and ``FOR UPDATE`` on their rows, their events,
task and dispatch rows read into :class:`WorkflowState` objects, the pure conductor's
decisions (:class:`Step`) applied by one statement per kind of write for the whole
batch, and the events deleted -- each reaction commits with its events' deletion or not
at all (docs/architecture.md, "Workflow advancement"). Batching is what makes many
workflows at once cheap: a statement and a commit serve the batch, not each workflow
(bench/workflows.py).

A workflow whose advancement raises (a corrupt definition, a bug, an unknown action)
is failed with the error named, in a transaction of its own: it can neither crash the
executor nor hold up the other workflows. A decision that breaks while being applied
(an unexpected database error) rolls the batch back, and its workflows are then
advanced one by one, so that only the broken one fails.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from psycopg import AsyncCursor, AsyncPipeline
from psycopg.types.json import Jsonb

from conveyor.config.workflow import WorkflowBounds
from conveyor.domain.documents import DEFAULT_LIMITS as DEFAULT_DOCUMENTS
from conveyor.domain.documents import Limits as DocumentLimits
from conveyor.executor.workflow_rows import (
    TERMINAL,
    ActionRow,
    Charges,
    ChildExecutionRow,
    ChildRow,
    ClaimRow,
    DefinitionRow,
    DispatchRow,
    EventRow,
    IdRow,
    PendingRow,
    RowCache,
    Rows,
    TaskRow,
    TimeoutsRow,
    VersionRow,
    WorkflowBroken,
    WorkflowRow,
    Writes,
    event_of,
    over_bound,
    result_of,
    rows_by_workflow,
    state_of,
    typed,
)
from conveyor.expressions import Limits as ExpressionLimits
from conveyor.ops import failpoints
from conveyor.store.db import SESSION_ENDED, AsyncConn, Pool
from conveyor.store.queries import Q
from conveyor.workflows.conductor import advance
from conveyor.workflows.spec import WorkflowSpec
from conveyor.workflows.state import CancelRequested, DispatchKey, Event, Step, WorkflowState

log = structlog.get_logger(__name__)

ACTIVE = ("running", "paused", "canceling")  # the workflow's execution statuses that advance
Decide = Callable[[WorkflowSpec, WorkflowState, Sequence[Event]], Step]
Reading = tuple[list[int], AsyncCursor[TaskRow], AsyncCursor[DispatchRow]]  # ids; their tasks' and dispatches'
Executions = dict[int, dict[DispatchKey, int]]  # the children made, by workflow and dispatch key
__all__ = ["Advancer", "PassResult", "WorkflowBroken"]


@dataclass(frozen=True, slots=True)
class PassResult:
    advanced: int  # workflows whose events were applied
    failed: int  # workflows failed because their advancement broke
    skipped: int  # workflows another replica was advancing


class Advancer:
    def __init__(
        self,
        pool: Pool,
        *,
        batch_size: int = 50,
        decide: Decide | None = None,
        bounds: WorkflowBounds | None = None,
        documents: DocumentLimits | None = None,
    ) -> None:
        self._pool = pool
        self._batch_size = batch_size
        self._bounds = bounds or WorkflowBounds.model_validate({})
        # Expressions' from_json_string() and the like read within the documents.* settings.
        limits = ExpressionLimits(documents=documents or DEFAULT_DOCUMENTS)
        self._decide: Decide = decide or functools.partial(advance, limits=limits)  # tests script decisions
        self._specs: dict[tuple[str, int], WorkflowSpec] = {}  # definitions are immutable
        self._actions: set[str] = set()  # action refs known to exist
        self._cache = RowCache()

    async def run_pass(self) -> PassResult:
        """Advance the workflows with pending events (up to a batch), found and locked by
        the first statement of the transaction that applies them (no read before it: the
        wake-up of a child's end is followed by its advancement's first round trip)."""
        return await self._advance_many(None)

    async def timeouts(self) -> int:
        """Task and workflow deadlines passed -> 'timeout' events (the reconciler)."""
        async with self._pool.connection() as conn:
            row = await typed(TimeoutsRow, await conn.execute(Q["workflow_timeouts"])).fetchone()
        return int(row["events"]) if row else 0

    async def advance(self, workflow_id: int) -> str:
        """Apply one workflow's events: "advanced", "skipped" (locked elsewhere, or
        nothing to do) or "failed" (its advancement broke: the workflow was failed)."""
        result = await self.advance_many([workflow_id])
        return "advanced" if result.advanced else "failed" if result.failed else "skipped"

    async def advance_many(self, ids: Sequence[int]) -> PassResult:
        """Apply these workflows' events in one transaction; one whose advancement
        broke is failed on its own (see the module's docstring)."""
        if not ids:
            return PassResult(0, 0, 0)
        return await self._advance_many(list(ids))

    async def _advance_many(self, ids: list[int] | None) -> PassResult:
        """``ids``, or (None) the pending workflows, advanced in one pipelined transaction:
        statements that need no earlier result travel together (see :meth:`_advance`)."""
        broken: dict[int, Exception] = {}
        seen: list[int] = list(ids or ())  # the workflows this pass took up (pending ones: read first)
        try:
            async with self._pool.connection() as conn:
                async with conn.pipeline() as pipeline, conn.transaction():
                    advanced, done = await self._advance(conn, pipeline, ids, seen, broken)
                await done()  # committed: the cache learns what was written
            if advanced:
                failpoints.reach("workflow.after_commit")
        except SESSION_ENDED:
            raise  # the database is unreachable: the events stay for the next pass
        except Exception as batch_error:
            if not seen:
                raise  # not even the pending workflows were read: the loop's error (logged, retried)
            if len(seen) == 1:
                broken = {seen[0]: batch_error}
                advanced = 0
            else:  # which one broke the batch? Each alone: only that one fails.
                log.warning(
                    "a batch of workflow advancements failed; advancing them one by one", error=repr(batch_error)
                )
                results = [await self.advance_many([wid]) for wid in seen]
                return PassResult(*(sum(getattr(r, f) for r in results) for f in ("advanced", "failed", "skipped")))
        for wid, exc in broken.items():
            if over_bound(exc):  # the definition's doing, not a defect: no traceback
                log.warning("workflow over a bound; failing the workflow", workflow_execution=wid, error=str(exc))
            else:
                log.error(
                    "workflow advancement failed; failing the workflow",
                    workflow_execution=wid,
                    error=repr(exc),
                    exc_info=None if isinstance(exc, WorkflowBroken) else exc,
                )
            await self._fail(wid, exc)
        return PassResult(advanced, len(broken), len(seen) - advanced - len(broken))

    async def _advance(
        self,
        conn: AsyncConn,
        pipeline: AsyncPipeline,
        ids: list[int] | None,
        seen: list[int],
        broken: dict[int, Exception],
    ) -> tuple[int, Callable[[], Awaitable[None]]]:
        """Lock, read, decide and apply; the workflows that broke before any write go into
        ``broken`` (their events left for :meth:`_fail`). Returns how many advanced, and
        what to do once committed (the cache's update: a rolled-back write is not cached).

        Pipelined (conn is in pipeline mode): a statement's results are awaited only when
        a decision needs them, so the batch costs about five round trips: the locks; the
        rows, events, tasks and dispatches; the dispatch claims; the children; the rest
        with the commit."""
        if ids is None:  # the first statement: BEGIN travels with it
            cursor = typed(PendingRow, await conn.execute(Q["workflow_pending_try_lock"], {"limit": self._batch_size}))
            pending = await cursor.fetchall()
            seen += [r["id"] for r in pending]
            locked = [r["id"] for r in pending if r["locked"]]
        else:
            cursor_ids = typed(IdRow, await conn.execute(Q["workflow_try_lock"], {"ids": ids}))
            locked = [r["id"] for r in await cursor_ids.fetchall()]
        if not locked:
            return 0, _nothing
        lock_rows = typed(WorkflowRow, await conn.execute(Q["workflow_lock"], {"ids": locked}))
        event_rows = typed(EventRow, await conn.execute(Q["workflow_events"], {"ids": locked}))
        # Rows not cached are read in the same round trip (a cached version that turns out
        # stale costs one more, in _rows).
        reading = await self._read_rows(conn, [wid for wid in locked if not self._cache.has(wid)])
        wfs = await lock_rows.fetchall()
        events: dict[int, list[EventRow]] = {}
        for r in await event_rows.fetchall():
            events.setdefault(r["workflow_execution"], []).append(r)
        wfs = [wf for wf in wfs if wf["id"] in events]
        live = [wf for wf in wfs if wf["status"] not in TERMINAL and wf["execution_status"] in ACTIVE]
        # Ended (a late child's end, a verb raced the end): nothing left to decide.
        rows = await self._rows(conn, live, reading) if live else {}
        for wf in wfs:
            if wf not in live:
                self._cache.drop(wf["id"])
        consumed: list[int] = [e["id"] for wf in wfs if wf not in live for e in events[wf["id"]]]
        decided: list[tuple[WorkflowRow, str, Step | None, str]] = []
        for wf in live:
            try:
                spec = await self._spec(conn, wf["workflow_ref"], wf["version"])
                step, policy = self._step(spec, state_of(wf, rows[wf["id"]]), wf, events[wf["id"]])
            except Exception as exc:  # this workflow alone: failed after the batch commits
                broken[wf["id"]] = exc
                continue
            decided.append((wf, spec.ref, step, policy))
        unknown = await self._unknown_actions(
            conn, {c.action_ref for *_, step, _ in decided if step for c in step.children}
        )
        writes = Writes()
        charges = Charges()
        applied: list[tuple[WorkflowRow, Step]] = []
        for wf, ref, step, policy in decided:
            missing = sorted(
                {f"{c.task}: {c.action_ref}" for c in step.children if c.action_ref in unknown} if step else ()
            )
            if missing:  # found before any write: fails this workflow alone, not the batch
                broken[wf["id"]] = WorkflowBroken("unknown action (task: action): " + ", ".join(missing))
                continue
            if step is not None:
                writes.add(wf, ref, step, policy)
                applied.append((wf, step))
                charges.new_tasks(wf["id"], step, rows[wf["id"]])
            consumed += [e["id"] for e in events[wf["id"]]]
        updated, executions = await self._apply(conn, writes, charges)
        await conn.execute(Q["workflow_consume_events"], {"ids": consumed})
        if failpoints.armed("workflow.before_commit"):
            await pipeline.sync()  # everything applied on the server, uncommitted
        failpoints.reach("workflow.before_commit")

        async def done() -> None:
            versions = {r["id"]: r["row_version"] for r in await updated.fetchall()} if updated else {}
            for wf, step in applied:
                wid = wf["id"]
                if wid in executions and wid in versions:
                    ended = (step.status or wf["status"]) in TERMINAL
                    self._cache.put(wid, versions[wid], rows[wid], step, executions[wid], ended)
                else:  # some child was requested already (a replay): read the rows next time
                    self._cache.drop(wid)

        return len(wfs) - len(broken), done

    def _step(
        self, spec: WorkflowSpec, state: WorkflowState, wf: WorkflowRow, rows: list[EventRow]
    ) -> tuple[Step | None, str]:
        events = [e for e in (event_of(r, wf) for r in rows) if e is not None]
        policy = wf["cancel_policy"]
        for e in events:
            if isinstance(e, CancelRequested) and policy != "cancel_running":
                policy = e.policy
        step = self._decide(spec, state, events) if events else None
        return step, policy

    async def _spec(self, conn: AsyncConn, ref: str, version: int) -> WorkflowSpec:
        key = (ref, version)
        spec = self._specs.get(key)
        if spec is None:
            params = {"ref": ref, "version": version}
            row = await typed(DefinitionRow, await conn.execute(Q["workflow_definition"], params)).fetchone()
            if row is None:
                raise WorkflowBroken(f"definition {ref} version {version} not found")
            try:
                spec = WorkflowSpec.from_json(row["definition"])
            except Exception as exc:
                raise WorkflowBroken(f"definition {ref} version {version} is corrupt: {exc!r}") from exc
            self._specs[key] = spec
        return spec

    async def _unknown_actions(self, conn: AsyncConn, refs: set[str]) -> set[str]:
        """The refs with no action row. Known ones are remembered: an action deleted
        since is still caught by the children's insert (it fails the batch, then the
        workflow alone)."""
        ask = sorted(refs - self._actions)
        if not ask:
            return set()
        rows = await typed(ActionRow, await conn.execute(Q["workflow_existing_actions"], {"refs": ask})).fetchall()
        self._actions.update(r["ref"] for r in rows)
        return set(ask) - self._actions

    async def _read_rows(self, conn: AsyncConn, ids: list[int]) -> Reading | None:
        """Send the reads of these workflows' task and dispatch rows (fetched by _rows)."""
        if not ids:
            return None
        tasks = typed(TaskRow, await conn.execute(Q["workflow_tasks"], {"ids": ids}))
        return ids, tasks, typed(DispatchRow, await conn.execute(Q["workflow_dispatches"], {"ids": ids}))

    async def _rows(self, conn: AsyncConn, wfs: list[WorkflowRow], reading: Reading | None) -> dict[int, Rows]:
        """Each workflow's task and dispatch rows: cached (at its row version), or read."""
        found = {wf["id"]: self._cache.get(wf["id"], wf["row_version"]) for wf in wfs}
        rows = {wid: r for wid, r in found.items() if r is not None}
        if reading is not None:
            rows |= await _rows_from(reading)
        stale = [wid for wid, r in found.items() if r is None and wid not in rows]
        if stale:  # cached at another version (changed elsewhere): read now
            stale_reading = await self._read_rows(conn, stale)
            assert stale_reading is not None
            rows |= await _rows_from(stale_reading)
        return rows

    async def _apply(
        self, conn: AsyncConn, writes: Writes, charges: Charges
    ) -> tuple[AsyncCursor[VersionRow] | None, Executions]:
        """The batch's decisions, one statement per kind of write, sent without waiting
        but for the children (their dispatch claims, then their ids). Returns the cursor
        of the workflow rows' new versions (read after the commit), and the new children's
        ids by dispatch key of each workflow whose children were all made here."""
        executions: Executions = {wid: {} for wid in writes.update["ids"]}
        if writes.tasks["wids"]:
            await conn.execute(Q["workflow_upsert_tasks"], writes.tasks)
        if writes.dispatches["wids"]:
            await conn.execute(Q["workflow_upsert_dispatches"], writes.dispatches)
        if writes.children:
            await self._request_children(conn, writes, executions, charges)
        if charges.any():
            # Not awaited: over a bound it raises, and the advancement rolls back whole.
            await conn.execute(Q["workflow_charge_trees"], charges.params(self._bounds))
        if writes.cancel["ids"]:
            await conn.execute(Q["workflow_cancel_children"], writes.cancel)
        updated = None
        if writes.update["ids"]:
            updated = typed(VersionRow, await conn.execute(Q["workflow_update"], writes.update))
        if writes.end["executions"]:
            await conn.execute(Q["workflow_resume_execution"], {"executions": writes.end["executions"]})
            await conn.execute(Q["workflow_end_execution"], writes.end)
        return updated, executions

    async def _request_children(
        self, conn: AsyncConn, writes: Writes, executions: Executions, charges: Charges
    ) -> None:
        cursor = typed(ClaimRow, await conn.execute(Q["workflow_claim_dispatches"], writes.claims()))
        claimed = {
            (r["workflow_execution"], r["task_name"], r["iteration"], r["task_index"]): r["id"]
            for r in await cursor.fetchall()
        }
        failpoints.reach("workflow.after_dispatch_row")
        new = [
            (claimed[key], wf, c)
            for wf, c in writes.children
            if (key := (wf["id"], c.task, c.iteration, c.index)) in claimed
        ]
        if len(new) < len(writes.children):
            log.info("children already requested were not requested again", duplicates=len(writes.children) - len(new))
            for wf, c in writes.children:
                if (wf["id"], c.task, c.iteration, c.index) not in claimed:
                    executions.pop(wf["id"], None)
        if not new:
            return
        for _, wf, _ in new:  # the children made here, not those a replay found made
            charges.executions[wf["id"]] = charges.executions.get(wf["id"], 0) + 1
        children = typed(
            ChildRow,
            await conn.execute(
                Q["workflow_request_children"],
                {
                    "dispatches": [d for d, _, _ in new],
                    "parents": [wf["execution"] for _, wf, _ in new],
                    "refs": [c.action_ref for *_, c in new],
                    "parameters": [Jsonb(c.parameters) for *_, c in new],
                    "delays": [c.delay for *_, c in new],
                },
            ),
        )
        made = {r["id"]: r["execution"] for r in await children.fetchall()}
        missing = sorted({f"{c.task}: {c.action_ref}" for d, _, c in new if d not in made})
        if missing:  # an action deleted since it was checked: the batch rolls back
            raise WorkflowBroken("unknown action (task: action): " + ", ".join(missing))
        for d, wf, c in new:
            if wf["id"] in executions:
                executions[wf["id"]][(c.task, c.iteration, c.index)] = made[d]
        failpoints.reach("workflow.after_child_row")

    async def _fail(self, workflow_id: int, exc: BaseException) -> None:
        """Fail a workflow whose advancement broke, naming the error; its running
        children are cancelled and its events consumed. Best effort: if this fails too,
        the events stay and the next pass tries again (logged, never a crash)."""
        if over_bound(exc):  # the error names the bound and its setting: as it is
            message = str(exc.diag.message_primary)  # type: ignore[attr-defined]
        else:
            error = str(exc) if isinstance(exc, WorkflowBroken) else f"{type(exc).__name__}: {exc}"
            message = f"workflow advancement failed: {error}"
        try:
            async with self._pool.connection() as conn, conn.transaction():
                ids = [workflow_id]
                await conn.execute(Q["workflow_try_lock"], {"ids": ids})
                wf = await typed(WorkflowRow, await conn.execute(Q["workflow_lock"], {"ids": ids})).fetchone()
                if wf is None:
                    return
                rows = await typed(EventRow, await conn.execute(Q["workflow_events"], {"ids": ids})).fetchall()
                children = await conn.execute(Q["workflow_running_children"], {"id": workflow_id})
                running = await typed(ChildExecutionRow, children).fetchall()
                if running:
                    by = f"workflow execution {wf['execution']}"
                    await conn.execute(
                        Q["workflow_cancel_children"],
                        {
                            "ids": [r["execution"] for r in running],
                            "bys": [by] * len(running),
                        },
                    )
                errors = [*wf["errors"], {"error": message}]
                await conn.execute(
                    Q["workflow_update"],
                    {
                        "ids": ids,
                        "statuses": ["failed"],
                        "contexts": [Jsonb(wf["context"])],
                        "outputs": [Jsonb(None)],
                        "errors": [Jsonb(errors)],
                        "cancel_policies": [wf["cancel_policy"]],
                    },
                )
                executions = [wf["execution"]]
                await conn.execute(Q["workflow_resume_execution"], {"executions": executions})
                result = result_of("failed", None, tuple(errors), None)
                await conn.execute(
                    Q["workflow_end_execution"],
                    {
                        "executions": executions,
                        "statuses": ["failed"],
                        "results": [Jsonb(result)],
                    },
                )
                await conn.execute(Q["workflow_consume_events"], {"ids": [r["id"] for r in rows]})
        except SESSION_ENDED:
            raise
        except Exception:
            log.exception("could not fail a broken workflow; retried at the next pass", workflow_execution=workflow_id)


async def _rows_from(reading: Reading) -> dict[int, Rows]:
    ids, tasks, dispatches = reading
    return rows_by_workflow(ids, await tasks.fetchall(), await dispatches.fetchall())


async def _nothing() -> None:
    return None
