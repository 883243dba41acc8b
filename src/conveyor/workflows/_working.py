"""The conductor's working copy of one advancement: the rows it read, what it changed,
and the bookkeeping that keeps an advancement O(events + newly dispatched).

The state's dispatches are never copied: a ``with`` task of 10,000 items has 10,000
rows, so changes go into an overlay and the only full pass over them is the one in
``__init__`` that builds a :class:`Tally` per task instance.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from conveyor.expressions import DEFAULT_LIMITS, ExpressionError, Limits, Scope, evaluate
from conveyor.workflows.spec import WorkflowSpec
from conveyor.workflows.state import (
    Dispatch,
    DispatchKey,
    NewChild,
    Step,
    TaskKey,
    TaskRun,
    WorkflowState,
    WorkflowStatus,
)

TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class Stop(Exception):
    """An error was recorded (the workflow is failing): abandon the current operation."""


@dataclass(slots=True)
class Tally:
    """A task instance's dispatches, kept up to date as the advancement goes."""

    running: set[DispatchKey] = field(default_factory=set)  # includes deferred retries
    dispatched: int = 0  # rows created; for ``with`` the next item index (dispatched in order)
    failed: int = 0


class Working:
    def __init__(self, spec: WorkflowSpec, state: WorkflowState, limits: Limits = DEFAULT_LIMITS) -> None:
        self.spec = spec
        self.limits = limits  # of each evaluate(): time, size, and documents.* for from_json_string()
        self.state = state
        self.status: WorkflowStatus = state.status
        self.context: dict[str, Any] = dict(state.context)
        self.errors: list[dict[str, Any]] = list(state.errors)
        self.tasks: dict[TaskKey, TaskRun] = dict(state.tasks)
        self.changed_tasks: dict[TaskKey, TaskRun] = {}
        self.changed_dispatches: dict[DispatchKey, Dispatch] = {}
        self.children: dict[DispatchKey, NewChild] = {}
        self.cancel: dict[int, None] = {}  # executions to cancel, in order, once each
        self.output: Any = None
        self.latest: dict[str, int] = {}
        for name, iteration in state.tasks:
            self.latest[name] = max(iteration, self.latest.get(name, -1))
        self.tallies: dict[TaskKey, Tally] = {}
        # Retries deferred while paused: rows stored with no execution yet.
        self.deferred: set[DispatchKey] = set()
        for d in state.dispatches.values():
            tally = self.tally((d.task, d.iteration))
            tally.dispatched += 1
            if d.status == "running":
                tally.running.add(d.key)
                if d.execution is None:
                    self.deferred.add(d.key)
            elif d.status == "failed":
                tally.failed += 1
        # Task instances to start, in order (a queue, not recursion: action-less tasks
        # chain through transitions within one advancement).
        self.to_start: deque[tuple[TaskKey, bool]] = deque()
        self._view: dict[str, dict[str, Any]] | None = None
        self._inbound: dict[str, frozenset[str]] = {}

    # -- rows ------------------------------------------------------------------------

    def tally(self, key: TaskKey) -> Tally:
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = Tally()
        return tally

    def put_task(self, run: TaskRun) -> TaskRun:
        key = (run.name, run.iteration)
        self.tasks[key] = run
        self.changed_tasks[key] = run
        self.latest[run.name] = max(run.iteration, self.latest.get(run.name, -1))
        self._view = None
        return run

    def update_task(self, key: TaskKey, **changes: Any) -> TaskRun:
        return self.put_task(replace(self.tasks[key], **changes))

    def dispatch(self, key: DispatchKey) -> Dispatch | None:
        d = self.changed_dispatches.get(key)
        return d if d is not None else self.state.dispatches.get(key)

    def put_dispatch(self, d: Dispatch) -> None:
        """Record a dispatch change, keeping its task instance's tally in step."""
        old = self.dispatch(d.key)
        tally = self.tally((d.task, d.iteration))
        if old is None:
            tally.dispatched += 1
        elif old.status == "failed":
            tally.failed -= 1
        if d.status == "running":
            tally.running.add(d.key)
        else:
            tally.running.discard(d.key)
            self.deferred.discard(d.key)
            self.children.pop(d.key, None)  # requested in this advancement: never created
            if d.status == "failed":
                tally.failed += 1
        self.changed_dispatches[d.key] = d

    def request(self, child: NewChild, *, defer: bool = False) -> None:
        """A child for (task, iteration, index), or while paused the same dispatch row
        with no execution, requested on resume."""
        key = (child.task, child.iteration, child.index)
        self.put_dispatch(Dispatch(child.task, child.iteration, child.index, None, child.retry))
        if defer:
            self.deferred.add(key)
        else:
            self.deferred.discard(key)
            self.children[key] = child

    def inbound(self, name: str) -> frozenset[str]:
        """The distinct tasks with a transition to ``name``: a join waits for one arrival
        from each (Orquesta counts inbound tasks, so a task routing both its success and
        its failure to the join counts once)."""
        found = self._inbound.get(name)
        if found is None:
            found = self._inbound[name] = frozenset(self.spec.inbound(name))
        return found

    # -- status ----------------------------------------------------------------------

    @property
    def canceling(self) -> bool:
        return self.status in ("canceling", "cancelled")

    @property
    def stopping(self) -> bool:
        """Nothing new starts: the workflow is being cancelled, is failing, or ended."""
        return self.canceling or bool(self.errors) or self.status in TERMINAL

    @property
    def paused(self) -> bool:
        return self.status == "paused"

    def fail(self, task: TaskKey | None, message: str, **details: Any) -> None:
        """Record an error: the workflow fails once its running children ended."""
        error: dict[str, Any] = {"task": task[0] if task else None, "iteration": task[1] if task else None}
        error["message"] = message
        error.update(details)
        self.errors.append(error)

    # -- expressions -----------------------------------------------------------------

    def tasks_view(self) -> dict[str, dict[str, Any]]:
        """``task(name)``: the latest instance of each task (rebuilt only after a change)."""
        if self._view is None:
            self._view = {}
            for name, iteration in self.latest.items():
                run = self.tasks[(name, iteration)]
                self._view[name] = {"status": run.status, "result": run.result}
        return self._view

    def scope(self, **kwargs: Any) -> Scope:
        return Scope(ctx=self.context, tasks=self.tasks_view(), **kwargs)

    def evaluate(self, value: Any, scope: Scope, task: TaskKey | None, where: str) -> Any:
        """Evaluate, or record the error naming the task, the expression and where it was
        (``input``, ``next[0].when``, ...) and raise :class:`Stop`. Never lets an
        exception out: a definition that fails at run time fails its workflow, it does not
        crash-loop the executor."""
        try:
            return evaluate(value, scope, self.limits)
        except ExpressionError as e:
            self.fail(task, f"{where}: {e.message}", expression=e.expression, where=where)
        except Exception as e:  # an evaluator defect fails this workflow only, never the executor
            expression = value if isinstance(value, str) else repr(value)[:200]
            self.fail(task, f"{where}: {type(e).__name__}: {e}", expression=expression, where=where)
        raise Stop

    # -- the decision ----------------------------------------------------------------

    def step(self) -> Step:
        return Step(
            context=self.context,
            tasks=tuple(self.changed_tasks.values()),
            dispatches=tuple(d for k, d in self.changed_dispatches.items() if k not in self.children),
            children=tuple(self.children.values()),
            cancel=tuple(self.cancel),
            status=self.status if self.status != self.state.status else None,
            output=self.output,
            errors=tuple(self.errors),
        )
