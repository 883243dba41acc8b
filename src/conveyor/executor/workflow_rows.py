"""The rows of the workflow statements (typed), rows to the conductor's state and events,
and decisions to the parameters of the bulk statements that apply them
(executor/workflows.py): plain functions, no I/O.

Every write statement of queries/workflows.sql takes arrays with each row's workflow, so
one statement applies the decisions of a whole batch of workflows."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, TypeVar, cast

import psycopg
from psycopg import AsyncCursor
from psycopg.types.json import Jsonb

from conveyor.config.workflow import WorkflowBounds
from conveyor.store.db import Row
from conveyor.workflows.state import (
    CancelPolicy,
    CancelRequested,
    ChildEnded,
    Dispatch,
    DispatchKey,
    DispatchStatus,
    Event,
    NewChild,
    PauseRequested,
    Rerun,
    ResumeRequested,
    Started,
    Step,
    TaskKey,
    TaskRun,
    TaskStatus,
    TimedOut,
    WorkflowState,
    WorkflowStatus,
)

TERMINAL = ("succeeded", "failed", "cancelled")
EXECUTION_STATUS = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}


class WorkflowBroken(Exception):
    """The advancement of one workflow cannot go on (named in the workflow's result)."""


# -- the rows of the workflow statements (queries/workflows.sql) ------------------------
# Every connection makes dict rows (store/db.py): these TypedDicts are those dicts, typed
# per statement, so that mypy checks each column read by name and type. ``Any``: a JSON
# value (jsonb), whatever the document holds.

R = TypeVar("R")


def typed(shape: type[R], cursor: AsyncCursor[Row]) -> AsyncCursor[R]:
    """``cursor`` with its rows typed as ``shape`` (a cast: no conversion, no cost)."""
    return cast("AsyncCursor[R]", cursor)


class PendingRow(TypedDict):  # workflow_pending_try_lock
    id: int
    locked: bool


class IdRow(TypedDict):  # workflow_try_lock
    id: int


class WorkflowRow(TypedDict):  # workflow_lock: the workflow's state row and its execution's
    id: int
    execution: int
    workflow_ref: str
    version: int
    status: WorkflowStatus
    context: dict[str, Any]
    errors: list[dict[str, Any]]
    cancel_policy: CancelPolicy
    row_version: str
    execution_status: str
    parameters: dict[str, Any]
    cancelled_by: str | None


class EventRow(TypedDict):  # workflow_events: a child's end with its dispatch (None: a stale child)
    id: int
    workflow_execution: int
    kind: str
    execution: int | None
    payload: dict[str, Any] | None
    task_name: str | None
    iteration: int | None
    task_index: int | None
    child_status: str | None
    child_result: Any


class TaskRow(TypedDict):  # workflow_tasks
    workflow_execution: int
    task_name: str
    iteration: int
    status: TaskStatus
    arrivals: list[str]
    items_total: int | None
    result: Any
    error: str | None
    items: list[Any] | None
    concurrency: int | None


class DispatchRow(TypedDict):  # workflow_dispatches
    workflow_execution: int
    task_name: str
    iteration: int
    task_index: int | None
    execution: int | None
    retry: int
    status: DispatchStatus
    result: Any


class ClaimRow(TypedDict):  # workflow_claim_dispatches: a child's dispatch row, claimed
    id: int
    workflow_execution: int
    task_name: str
    iteration: int
    task_index: int | None


class ChildRow(TypedDict):  # workflow_request_children: a dispatch row and its new child
    id: int
    execution: int


class VersionRow(TypedDict):  # workflow_update: the row's new version (see RowCache)
    id: int
    row_version: str


class DefinitionRow(TypedDict):  # workflow_definition
    definition: dict[str, Any]


class ActionRow(TypedDict):  # workflow_existing_actions
    ref: str


class ChildExecutionRow(TypedDict):  # workflow_running_children
    execution: int


class TimeoutsRow(TypedDict):  # workflow_timeouts
    events: int


# -- rows to the conductor's state and events --------------------------------------------


def rows_by_workflow(ids: list[int], tasks: Sequence[TaskRow], dispatches: Sequence[DispatchRow]) -> dict[int, Rows]:
    """The task and dispatch rows of the workflows ``ids`` (read together), by workflow."""
    by_task: dict[int, list[TaskRow]] = {i: [] for i in ids}
    by_dispatch: dict[int, list[DispatchRow]] = {i: [] for i in ids}
    for t in tasks:
        by_task[t["workflow_execution"]].append(t)
    for d in dispatches:
        by_dispatch[d["workflow_execution"]].append(d)
    return {i: rows_of(by_task[i], by_dispatch[i]) for i in ids}


def rows_of(tasks: Sequence[TaskRow], dispatches: Sequence[DispatchRow]) -> Rows:
    runs = [
        TaskRun(
            t["task_name"],
            t["iteration"],
            t["status"],
            tuple(t["arrivals"]),
            t["items_total"],
            t["result"],
            t["error"],
            t["items"],
            t["concurrency"],
        )
        for t in tasks
    ]
    ds = [
        Dispatch(d["task_name"], d["iteration"], d["task_index"], d["execution"], d["retry"], d["status"], d["result"])
        for d in dispatches
    ]
    return Rows({(t.name, t.iteration): t for t in runs}, {d.key: d for d in ds})


def state_of(wf: WorkflowRow, rows: Rows) -> WorkflowState:
    return WorkflowState(
        status=wf["status"],
        context=wf["context"],
        tasks=dict(rows.tasks),
        dispatches=rows.dispatches,  # not copied: the conductor never changes it (an overlay)
        errors=tuple(wf["errors"]),
        cancel_policy=wf["cancel_policy"],
    )


def event_of(row: EventRow, wf: WorkflowRow) -> Event | None:
    """A stored event as the conductor's; None for a stale one (a child that is no
    longer its dispatch's current execution: its chain moved on)."""
    kind, payload = row["kind"], row["payload"] or {}
    if kind == "start":
        return Started(parameters=wf["parameters"])
    if kind == "child_ended":
        # The dispatch's columns are all set or all None (a LEFT JOIN that matched or not).
        execution, task, iteration, status = row["execution"], row["task_name"], row["iteration"], row["child_status"]
        if execution is None or task is None or iteration is None or status is None:
            return None
        return ChildEnded(execution, task, iteration, row["task_index"], status, row["child_result"])
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


def result_of(status: str, output: Any, errors: Sequence[dict[str, Any]], cancelled_by: str | None) -> Any:
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


TASK_COLUMNS = (
    "wids",
    "names",
    "iterations",
    "statuses",
    "arrivals",
    "items_totals",
    "items",
    "concurrencies",
    "results",
    "errors",
)
DISPATCH_COLUMNS = ("wids", "names", "iterations", "indexes", "executions", "retries", "statuses", "results")
UPDATE_COLUMNS = ("ids", "statuses", "contexts", "outputs", "errors", "cancel_policies")


@dataclass(slots=True)
class Writes:
    """The decisions of a batch, as the columns of the bulk statements."""

    tasks: dict[str, list[Any]] = field(default_factory=lambda: _columns(*TASK_COLUMNS))
    dispatches: dict[str, list[Any]] = field(default_factory=lambda: _columns(*DISPATCH_COLUMNS))
    children: list[tuple[WorkflowRow, NewChild]] = field(default_factory=list)  # (workflow row, child)
    cancel: dict[str, list[Any]] = field(default_factory=lambda: _columns("ids", "bys"))
    update: dict[str, list[Any]] = field(default_factory=lambda: _columns(*UPDATE_COLUMNS))
    end: dict[str, list[Any]] = field(default_factory=lambda: _columns("executions", "statuses", "results"))

    def add(self, wf: WorkflowRow, ref: str, step: Step, policy: str) -> None:
        wid = wf["id"]
        for t in step.tasks:
            items = None if t.items is None else Jsonb(t.items)
            _append(
                self.tasks,
                wid,
                t.name,
                t.iteration,
                t.status,
                Jsonb(list(t.arrivals)),
                t.items_total,
                items,
                t.concurrency,
                Jsonb(t.result),
                t.error,
            )
        new = {(c.task, c.iteration, c.index) for c in step.children}
        for d in step.dispatches:
            if d.key not in new:  # a new child's own claim writes its row
                _append(
                    self.dispatches, wid, d.task, d.iteration, d.index, d.execution, d.retry, d.status, Jsonb(d.result)
                )
        self.children += [(wf, c) for c in step.children]
        for execution in step.cancel:
            _append(self.cancel, execution, f"workflow {ref} (execution {wf['execution']})")
        status = step.status or wf["status"]
        output = step.output if status == "succeeded" else None
        _append(self.update, wid, status, Jsonb(step.context), Jsonb(output), Jsonb(list(step.errors)), policy)
        if status in TERMINAL:
            result = result_of(status, output, step.errors, wf["cancelled_by"])
            _append(self.end, wf["execution"], EXECUTION_STATUS[status], Jsonb(result))

    def claims(self) -> dict[str, list[Any]]:
        cols = _columns("wids", "names", "iterations", "indexes", "retries", "delays", "timeouts")
        for wf, c in self.children:
            _append(cols, wf["id"], c.task, c.iteration, c.index, c.retry, c.delay, c.timeout)
        return cols


def _columns(*names: str) -> dict[str, list[Any]]:
    return {name: [] for name in names}


def _append(columns: dict[str, list[Any]], *values: Any) -> None:
    for column, value in zip(columns.values(), values, strict=True):
        column.append(value)


@dataclass(frozen=True, slots=True)
class Rows:
    """A workflow's task and dispatch rows as the conductor reads them."""

    tasks: dict[TaskKey, TaskRun]
    dispatches: dict[DispatchKey, Dispatch]


class RowCache:
    """Each workflow's task and dispatch rows as this executor last wrote them, valid
    while the workflow row's version (its xmin) is the one written with them: a ``with``
    of 10,000 items is not read back, 10,000 rows, at each of its children's ends.
    Anything else that changed the workflow (another replica, a verb) changed the row
    version too, and the rows are read again. Bounded (least recently used dropped)."""

    def __init__(self, size: int = 2000) -> None:
        self._size = size
        self._entries: OrderedDict[int, tuple[str, Rows]] = OrderedDict()

    def get(self, wid: int, version: str) -> Rows | None:
        entry = self._entries.get(wid)
        if entry is None or entry[0] != version:
            return None
        self._entries.move_to_end(wid)
        return entry[1]

    def has(self, wid: int) -> bool:
        """Whether some version of this workflow's rows is cached (whichever)."""
        return wid in self._entries

    def drop(self, wid: int) -> None:
        self._entries.pop(wid, None)

    def put(
        self, wid: int, version: str, old: Rows, step: Step, executions: dict[DispatchKey, int], ended: bool
    ) -> None:
        """``old`` with ``step`` applied as the statements applied it; ``executions``:
        the new children's ids by dispatch key."""
        if ended:
            self.drop(wid)
            return
        tasks = dict(old.tasks)
        for t in step.tasks:  # as stored and read back: JSON values
            tasks[(t.name, t.iteration)] = replace(t, result=_json(t.result), items=_json(t.items))
        dispatches = dict(old.dispatches)
        for d in step.dispatches:
            prior = dispatches.get(d.key)
            execution = d.execution if d.execution is not None or prior is None else prior.execution
            dispatches[d.key] = replace(d, execution=execution, result=_json(d.result))
        for c in step.children:
            key = (c.task, c.iteration, c.index)
            dispatches[key] = Dispatch(c.task, c.iteration, c.index, executions[key], c.retry)
        self._entries[wid] = (version, Rows(tasks, dispatches))
        self._entries.move_to_end(wid)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)


def _json(value: Any) -> Any:
    return None if value is None else json.loads(json.dumps(value))


OVER_BOUND = "CVB01"  # charge_workflow_trees (migration 0033): a workflow.max_tree_* bound


def over_bound(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error) and exc.sqlstate == OVER_BOUND


@dataclass(slots=True)
class Charges:
    """What an advancement creates, by workflow, for its trees' counters."""

    tasks: dict[int, int] = field(default_factory=dict)  # new task instances
    executions: dict[int, int] = field(default_factory=dict)  # children made

    def new_tasks(self, wid: int, step: Step, rows: Rows) -> None:
        self.tasks[wid] = sum(1 for t in step.tasks if (t.name, t.iteration) not in rows.tasks)

    def any(self) -> bool:
        return any(self.tasks.values()) or any(self.executions.values())

    def params(self, bounds: WorkflowBounds) -> dict[str, Any]:
        wids = sorted(
            w for w in self.tasks.keys() | self.executions.keys() if self.tasks.get(w) or self.executions.get(w)
        )
        return {
            "wids": wids,
            "tasks": [self.tasks.get(w, 0) for w in wids],
            "executions": [self.executions.get(w, 0) for w in wids],
            "max_tasks": bounds.max_tree_tasks,
            "max_executions": bounds.max_tree_executions,
        }
