"""The executor's workflow duty: apply each workflow's pending events, exactly once.

Woken by the ``workflow`` topic (a child's end, a verb: cancel, pause, resume, rerun; a
start) and polled every ``workflow.poll_interval`` on every replica (the reconciler: a
replica killed mid-advancement leaves its events, which the next pass applies). Per
workflow, ONE transaction: the workflow's advisory lock and ``FOR UPDATE`` on its row,
its events, task and dispatch rows read into a :class:`WorkflowState`, the pure
conductor's decision (a :class:`Step`) applied, and the events deleted -- the reaction
commits with their deletion or not at all (docs/architecture.md, "Workflow
advancement").

A workflow whose advancement raises (a corrupt definition, a bug, an unknown action)
is failed with the error named, in a transaction of its own: it can neither crash the
executor nor hold up the other workflows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor import failpoints
from conveyor.store.queries import Q
from conveyor.workflows.spec import WorkflowSpec
from conveyor.workflows.state import (
    CancelRequested,
    ChildEnded,
    Dispatch,
    Event,
    NewChild,
    PauseRequested,
    Rerun,
    ResumeRequested,
    Started,
    Step,
    TaskRun,
    TimedOut,
    WorkflowState,
)

log = structlog.get_logger(__name__)

Decide = Callable[[WorkflowSpec, WorkflowState, Sequence[Event]], Step]
TERMINAL = ("succeeded", "failed", "cancelled")
EXECUTION_STATUS = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}


class WorkflowBroken(Exception):
    """The advancement of one workflow cannot go on (named in the workflow's result)."""


@dataclass(frozen=True, slots=True)
class PassResult:
    advanced: int  # workflows whose events were applied
    failed: int  # workflows failed because their advancement broke
    skipped: int  # workflows another replica was advancing


def _conductor() -> Decide:
    # Imported when first used: the conductor is a module of its own (workflows/conductor.py).
    decide: Decide = importlib.import_module("conveyor.workflows.conductor").advance
    return decide


class Advancer:
    def __init__(self, pool: AsyncConnectionPool[Any], *, batch_size: int = 50, decide: Decide | None = None) -> None:
        self._pool = pool
        self._batch_size = batch_size
        self._decide = decide
        self._specs: dict[tuple[str, int], WorkflowSpec] = {}  # definitions are immutable

    async def run_pass(self) -> PassResult:
        """Advance the workflows with pending events (up to a batch), each in its own
        transaction."""
        async with self._pool.connection() as conn:
            pending = await (await conn.execute(Q["workflows_pending"], {"limit": self._batch_size})).fetchall()
        advanced = failed = skipped = 0
        for row in pending:
            outcome = await self.advance(int(row["id"]))
            advanced += outcome == "advanced"
            failed += outcome == "failed"
            skipped += outcome == "skipped"
        return PassResult(advanced, failed, skipped)

    async def timeouts(self) -> int:
        """Task and workflow deadlines passed -> 'timeout' events (the reconciler)."""
        async with self._pool.connection() as conn:
            row = await (await conn.execute(Q["workflow_timeouts"])).fetchone()
        return int(row["events"]) if row else 0

    async def advance(self, workflow_id: int) -> str:
        """Apply one workflow's events: "advanced", "skipped" (locked elsewhere, or
        nothing to do) or "failed" (its advancement broke: the workflow was failed)."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                done = await self._advance(conn, workflow_id)
            if done:
                failpoints.reach("workflow.after_commit")
            return "advanced" if done else "skipped"
        except psycopg.OperationalError:
            raise  # the database is unreachable: the events stay for the next pass
        except Exception as exc:
            log.exception("workflow advancement failed; failing the workflow", workflow_execution=workflow_id)
            await self._fail(workflow_id, exc)
            return "failed"

    async def _advance(self, conn: Any, workflow_id: int) -> bool:
        locked = await (await conn.execute(Q["workflow_try_lock"], {"id": workflow_id})).fetchone()
        if not locked["locked"]:
            return False
        wf = await (await conn.execute(Q["workflow_lock"], {"id": workflow_id})).fetchone()
        rows = await (await conn.execute(Q["workflow_events"], {"id": workflow_id})).fetchall()
        if wf is None or not rows:
            return False
        ids = [r["id"] for r in rows]
        if wf["status"] in TERMINAL or wf["execution_status"] not in ("running", "paused", "canceling"):
            # Ended (a late child's end, a verb raced the end): nothing left to decide.
            await conn.execute(Q["workflow_consume_events"], {"ids": ids})
            return True
        spec = await self._spec(conn, wf["workflow_ref"], wf["version"])
        state = await self._state(conn, wf)
        events = [e for e in (_event(r, wf) for r in rows) if e is not None]
        policy = wf["cancel_policy"]
        for e in events:
            if isinstance(e, CancelRequested) and policy != "cancel_running":
                policy = e.policy
        step = (self._decide or _conductor())(spec, state, events) if events else None
        if step is not None:
            await self._apply(conn, wf, spec, step, policy)
        await conn.execute(Q["workflow_consume_events"], {"ids": ids})
        failpoints.reach("workflow.before_commit")
        return True

    async def _spec(self, conn: Any, ref: str, version: int) -> WorkflowSpec:
        key = (ref, version)
        spec = self._specs.get(key)
        if spec is None:
            row = await (await conn.execute(Q["workflow_definition"], {"ref": ref, "version": version})).fetchone()
            if row is None:
                raise WorkflowBroken(f"definition {ref} version {version} not found")
            try:
                spec = WorkflowSpec.from_json(row["definition"])
            except Exception as exc:
                raise WorkflowBroken(f"definition {ref} version {version} is corrupt: {exc!r}") from exc
            self._specs[key] = spec
        return spec

    async def _state(self, conn: Any, wf: dict[str, Any]) -> WorkflowState:
        tasks = await (await conn.execute(Q["workflow_tasks"], {"id": wf["id"]})).fetchall()
        dispatches = await (await conn.execute(Q["workflow_dispatches"], {"id": wf["id"]})).fetchall()
        runs = [TaskRun(t["task_name"], t["iteration"], t["status"], tuple(t["arrivals"]), t["items_total"],
                        t["result"], t["error"]) for t in tasks]  # fmt: skip
        ds = [Dispatch(d["task_name"], d["iteration"], d["task_index"], d["execution"], d["retry"], d["status"],
                       d["result"]) for d in dispatches]  # fmt: skip
        return WorkflowState(
            status=wf["status"],
            context=wf["context"],
            tasks={(t.name, t.iteration): t for t in runs},
            dispatches={d.key: d for d in ds},
            errors=tuple(wf["errors"]),
            cancel_policy=wf["cancel_policy"],
        )

    async def _apply(self, conn: Any, wf: dict[str, Any], spec: WorkflowSpec, step: Step, policy: str) -> None:
        wid = wf["id"]
        if step.tasks:
            await conn.execute(Q["workflow_upsert_tasks"], _tasks_params(wid, step.tasks))
        children = {(c.task, c.iteration, c.index) for c in step.children}
        dispatches = [d for d in step.dispatches if d.key not in children]
        if dispatches:
            await conn.execute(Q["workflow_upsert_dispatches"], _dispatch_params(wid, dispatches))
        if step.children:
            await self._request_children(conn, wf, step.children)
        if step.cancel:
            by = f"workflow {spec.ref} (execution {wf['execution']})"
            await conn.execute(Q["workflow_cancel_children"], {"ids": list(step.cancel), "by": by})
        status = step.status or wf["status"]
        output = step.output if status == "succeeded" else None
        await conn.execute(Q["workflow_update"], {
            "id": wid, "status": status, "context": Jsonb(step.context), "output": Jsonb(output),
            "errors": Jsonb(list(step.errors)), "cancel_policy": policy,
        })  # fmt: skip
        if status in TERMINAL:
            await conn.execute(Q["workflow_resume_execution"], {"execution": wf["execution"]})
            result = _result(status, output, step.errors, wf["cancelled_by"])
            params = {"execution": wf["execution"], "status": EXECUTION_STATUS[status], "result": Jsonb(result)}
            await conn.execute(Q["workflow_end_execution"], params)

    async def _request_children(self, conn: Any, wf: dict[str, Any], children: Sequence[NewChild]) -> None:
        cursor = await conn.execute(Q["workflow_claim_dispatches"], {
            "id": wf["id"], "names": [c.task for c in children], "iterations": [c.iteration for c in children],
            "indexes": [c.index for c in children], "retries": [c.retry for c in children],
            "delays": [c.delay for c in children], "timeouts": [c.timeout for c in children],
        })  # fmt: skip
        claimed = {(r["task_name"], r["iteration"], r["task_index"]): r["id"] for r in await cursor.fetchall()}
        failpoints.reach("workflow.after_dispatch_row")
        new = [
            (claimed[(c.task, c.iteration, c.index)], c) for c in children if (c.task, c.iteration, c.index) in claimed
        ]
        if len(new) < len(children):
            log.info("children already requested were not requested again", workflow_execution=wf["id"],
                     duplicates=len(children) - len(new))  # fmt: skip
        if not new:
            return
        cursor = await conn.execute(Q["workflow_request_children"], {
            "parent": wf["execution"], "dispatches": [d for d, _ in new], "refs": [c.action_ref for _, c in new],
            "parameters": [Jsonb(c.parameters) for _, c in new], "delays": [c.delay for _, c in new],
        })  # fmt: skip
        made = {r["id"] for r in await cursor.fetchall()}
        missing = sorted({f"{c.task}: {c.action_ref}" for d, c in new if d not in made})
        if missing:
            raise WorkflowBroken("unknown action (task: action): " + ", ".join(missing))
        failpoints.reach("workflow.after_child_row")

    async def _fail(self, workflow_id: int, exc: BaseException) -> None:
        """Fail a workflow whose advancement broke, naming the error; its running
        children are cancelled and its events consumed. Best effort: if this fails too,
        the events stay and the next pass tries again (logged, never a crash)."""
        error = str(exc) if isinstance(exc, WorkflowBroken) else f"{type(exc).__name__}: {exc}"
        message = f"workflow advancement failed: {error}"
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(Q["workflow_try_lock"], {"id": workflow_id})
                wf = await (await conn.execute(Q["workflow_lock"], {"id": workflow_id})).fetchone()
                if wf is None:
                    return
                rows = await (await conn.execute(Q["workflow_events"], {"id": workflow_id})).fetchall()
                running = await (await conn.execute(Q["workflow_running_children"], {"id": workflow_id})).fetchall()
                if running:
                    await conn.execute(Q["workflow_cancel_children"], {
                        "ids": [r["execution"] for r in running], "by": f"workflow execution {wf['execution']}",
                    })  # fmt: skip
                errors = [*wf["errors"], {"error": message}]
                await conn.execute(Q["workflow_update"], {
                    "id": workflow_id, "status": "failed", "context": Jsonb(wf["context"]), "output": Jsonb(None),
                    "errors": Jsonb(errors), "cancel_policy": wf["cancel_policy"],
                })  # fmt: skip
                await conn.execute(Q["workflow_resume_execution"], {"execution": wf["execution"]})
                result = _result("failed", None, tuple(errors), None)
                await conn.execute(Q["workflow_end_execution"], {
                    "execution": wf["execution"], "status": "failed", "result": Jsonb(result),
                })  # fmt: skip
                await conn.execute(Q["workflow_consume_events"], {"ids": [r["id"] for r in rows]})
        except psycopg.OperationalError:
            raise
        except Exception:
            log.exception("could not fail a broken workflow; retried at the next pass", workflow_execution=workflow_id)


def _event(row: dict[str, Any], wf: dict[str, Any]) -> Event | None:
    """A stored event as the conductor's; None for a stale one (a child that is no
    longer its dispatch's current execution: its chain moved on)."""
    kind, payload = row["kind"], row["payload"] or {}
    if kind == "start":
        return Started(parameters=wf["parameters"])
    if kind == "child_ended":
        if row["task_name"] is None:
            return None
        return ChildEnded(row["execution"], row["task_name"], row["iteration"], row["task_index"],
                          row["child_status"], row["child_result"])  # fmt: skip
    if kind == "cancel":
        return CancelRequested(payload.get("policy", "allow_finish"))
    if kind == "pause":
        return PauseRequested()
    if kind == "resume":
        return ResumeRequested()
    if kind == "timeout":
        return TimedOut(payload.get("task"), int(payload.get("iteration") or 0))
    if kind == "rerun":
        return Rerun(tuple((str(name), int(it)) for name, it in payload.get("tasks", [])))
    raise WorkflowBroken(f"unknown workflow event kind {kind!r}")


def _result(status: str, output: Any, errors: Sequence[dict[str, Any]], cancelled_by: str | None) -> Any:
    """The workflow execution's result, shaped like other executions': its output when
    it succeeded, else ``succeeded: false`` with an ``error`` line and every error."""
    if status == "succeeded":
        return output
    if status == "cancelled":
        error = f"cancelled by {cancelled_by}" if cancelled_by else "cancelled"
    else:
        first = errors[0] if errors else {}
        error = str(first.get("error") or first.get("message") or "workflow failed") if first else "workflow failed"
    return {"succeeded": False, "error": error, "errors": list(errors), "failed_by": "workflow"}


def _tasks_params(wid: int, tasks: Sequence[TaskRun]) -> dict[str, Any]:
    return {
        "id": wid, "names": [t.name for t in tasks], "iterations": [t.iteration for t in tasks],
        "statuses": [t.status for t in tasks], "arrivals": [Jsonb(list(t.arrivals)) for t in tasks],
        "items_totals": [t.items_total for t in tasks], "results": [Jsonb(t.result) for t in tasks],
        "errors": [t.error for t in tasks],
    }  # fmt: skip


def _dispatch_params(wid: int, dispatches: Sequence[Dispatch]) -> dict[str, Any]:
    return {
        "id": wid, "names": [d.task for d in dispatches], "iterations": [d.iteration for d in dispatches],
        "indexes": [d.index for d in dispatches], "executions": [d.execution for d in dispatches],
        "retries": [d.retry for d in dispatches], "statuses": [d.status for d in dispatches],
        "results": [Jsonb(d.result) for d in dispatches],
    }  # fmt: skip
