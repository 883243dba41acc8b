"""What the conductor reads and what it decides: the contract between the pure
conductor (conductor.py) and the executor that loads rows and applies decisions in one
transaction (executor/workflows.py).

The rows these mirror (migration "workflow state"):
- ``workflow_execution``: one per workflow execution -> :class:`WorkflowState`
- ``workflow_task``: one per task instance (task, iteration) -> :class:`TaskRun`
- ``workflow_task_dispatch``: one per child chain (task, iteration, item index) ->
  :class:`Dispatch`; retries replace its ``execution`` and count in ``retry``
- ``workflow_event``: what happened since the last advancement -> the event classes
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

TaskStatus = Literal["waiting", "running", "succeeded", "failed", "cancelled"]
DispatchStatus = Literal["running", "succeeded", "failed", "cancelled"]
WorkflowStatus = Literal["running", "paused", "canceling", "succeeded", "failed", "cancelled"]
CancelPolicy = Literal["allow_finish", "cancel_running"]

TaskKey = tuple[str, int]  # (task name, iteration)
DispatchKey = tuple[str, int, int | None]  # (task name, iteration, item index or None)


@dataclass(frozen=True, slots=True)
class TaskRun:
    """A task instance. ``iteration`` is 0 the first time the task is entered and one more
    each time a cycle enters it again. ``waiting``: a join whose inbound transitions have
    not all arrived (``arrivals`` lists the ones that did, one entry per arrival).
    ``items_total``: the number of items of a ``with`` task (None otherwise); ``result``:
    once ended, the action's result, or for ``with`` the list of item results in item
    order. ``items`` and ``concurrency``: a ``with`` task's list and limit, evaluated once
    when the instance started (later items are dispatched from this list, so a context
    that changed meanwhile does not change what the task iterates over)."""

    name: str
    iteration: int = 0
    status: TaskStatus = "running"
    arrivals: tuple[str, ...] = ()
    items_total: int | None = None
    result: Any = None
    error: str | None = None
    items: list[Any] | None = None
    concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A child chain: the current child execution of (task, iteration, index) and how
    many retries it used. ``execution`` is None for a child the executor is about to
    create (it fills the id in when it inserts the child), and in a stored row for a retry
    deferred while the workflow is paused (requested on resume)."""

    task: str
    iteration: int
    index: int | None
    execution: int | None
    retry: int = 0
    status: DispatchStatus = "running"
    result: Any = None

    @property
    def key(self) -> DispatchKey:
        return (self.task, self.iteration, self.index)


@dataclass(frozen=True, slots=True)
class WorkflowState:
    status: WorkflowStatus
    context: dict[str, Any]
    tasks: dict[TaskKey, TaskRun] = field(default_factory=dict)
    dispatches: dict[DispatchKey, Dispatch] = field(default_factory=dict)
    errors: tuple[dict[str, Any], ...] = ()
    cancel_policy: CancelPolicy = "allow_finish"


# -- events: what happened since the last advancement, in the order it happened ------


@dataclass(frozen=True, slots=True)
class Started:
    """The workflow execution was claimed: ``parameters`` are its execution's."""

    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChildEnded:
    """A child execution reached a terminal status (``completed``, ``failed``,
    ``timeout``, ``cancelled``, ``abandoned``) with its ``result``."""

    execution: int
    task: str
    iteration: int
    index: int | None
    status: str
    result: Any


@dataclass(frozen=True, slots=True)
class CancelRequested:
    policy: CancelPolicy = "allow_finish"


@dataclass(frozen=True, slots=True)
class PauseRequested:
    pass


@dataclass(frozen=True, slots=True)
class ResumeRequested:
    pass


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The workflow's deadline (its ``timeout``) passed, or with ``task`` set, a task's."""

    task: str | None = None
    iteration: int = 0


@dataclass(frozen=True, slots=True)
class Rerun:
    """Rerun from the failed tasks: the state was copied from the failed execution,
    failed task instances are to be started again, completed ones kept."""

    tasks: tuple[TaskKey, ...]


Event = Started | ChildEnded | CancelRequested | PauseRequested | ResumeRequested | TimedOut | Rerun


# -- the decision ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewChild:
    """A child execution to request: ``action_ref`` with ``parameters``, not before
    ``delay`` seconds from now (task ``delay`` or retry backoff: a timer row, never a
    sleep), failed as ``timeout`` after ``timeout`` seconds of running if set."""

    task: str
    iteration: int
    index: int | None
    action_ref: str
    parameters: dict[str, Any]
    retry: int = 0
    delay: float = 0.0
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """What one advancement does, applied in one transaction: upsert ``tasks`` and
    ``dispatches`` (by key), request ``children`` (each also upserts its dispatch row
    with the new execution), cancel the executions in ``cancel``, store ``context``, and
    if ``status`` is set move the workflow (and its execution) there; a terminal status
    carries ``output`` (succeeded) or ``errors`` (failed) as the execution's result.

    ``errors`` is always the workflow's full list (store it every time, like ``context``):
    a running workflow with errors is failing -- it starts nothing new and fails once its
    running children ended. A dispatch that gets a child in ``children`` is not repeated
    in ``dispatches``: the child's upsert writes it (status running, its ``retry``)."""

    context: dict[str, Any]
    tasks: tuple[TaskRun, ...] = ()
    dispatches: tuple[Dispatch, ...] = ()
    children: tuple[NewChild, ...] = ()
    cancel: tuple[int, ...] = ()
    status: WorkflowStatus | None = None
    output: Any = None
    errors: tuple[dict[str, Any], ...] = ()
