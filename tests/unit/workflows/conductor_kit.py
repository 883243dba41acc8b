"""Builders and a little executor for the conductor's unit tests: ``Sim`` applies each
Step to the state the way the executor does (upserts by key, an id for each new child),
so a test drives a workflow event by event and reads rows, not internals."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from conveyor.workflows.conductor import advance
from conveyor.workflows.spec import InputSpec, RetrySpec, TaskSpec, Transition, WithItems, WorkflowSpec
from conveyor.workflows.state import (
    ChildEnded,
    Dispatch,
    DispatchKey,
    Event,
    NewChild,
    Started,
    Step,
    TaskKey,
    TaskRun,
    WorkflowState,
)

__all__ = ["InputSpec", "RetrySpec", "Sim", "WithItems", "envelope", "task", "to", "wf"]


def wf(*tasks: TaskSpec, **kwargs: Any) -> WorkflowSpec:
    return WorkflowSpec(ref="test.wf", tasks={t.name: t for t in tasks}, **kwargs)


def task(name: str, *next_: Transition, action: str | None = "core.noop", **kwargs: Any) -> TaskSpec:
    return TaskSpec(name=name, action=action, next=tuple(next_), **kwargs)


def to(*do: str, when: str | None = None, publish: dict[str, Any] | None = None) -> Transition:
    return Transition(when=when, publish=tuple((publish or {}).items()), do=tuple(do))


def envelope(data: Any = None, *, succeeded: bool = True, error: str | None = None, stdout: str = "") -> dict[str, Any]:
    """What a worker stores as an action's result (domain.models.ActionResult)."""
    return {"succeeded": succeeded, "exit_code": 0 if succeeded else 1, "duration": 0.01, "stdout": stdout,
            "stderr": "", "data": data, "error": error}  # fmt: skip


@dataclass
class Sim:
    spec: WorkflowSpec
    state: WorkflowState = field(default_factory=lambda: WorkflowState(status="running", context={}))
    next_id: int = 100
    children: dict[int, NewChild] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def advance(self, *events: Event) -> Step:
        step = advance(self.spec, self.state, events)
        self.apply(step)
        return step

    def apply(self, step: Step) -> None:
        tasks = dict(self.state.tasks)
        dispatches = dict(self.state.dispatches)
        for run in step.tasks:
            tasks[(run.name, run.iteration)] = run
        for d in step.dispatches:
            dispatches[d.key] = d
        for child in step.children:
            self.next_id += 1
            self.children[self.next_id] = child
            key = (child.task, child.iteration, child.index)
            dispatches[key] = Dispatch(child.task, child.iteration, child.index, self.next_id, child.retry)
        self.state = WorkflowState(
            status=step.status or self.state.status,
            context=dict(step.context),
            tasks=tasks,
            dispatches=dispatches,
            errors=step.errors,
        )
        self.steps.append(step)

    def start(self, **parameters: Any) -> Step:
        return self.advance(Started(parameters))

    # -- reading -------------------------------------------------------------------

    @property
    def status(self) -> str:
        return self.state.status

    def output(self) -> object:
        return self.steps[-1].output

    def run(self, name: str, iteration: int = 0) -> TaskRun:
        return self.state.tasks[(name, iteration)]

    def running(self) -> list[int]:
        """Executions of the children running now, oldest first."""
        return sorted(
            d.execution for d in self.state.dispatches.values() if d.status == "running" and d.execution is not None
        )

    def child(self, execution: int) -> NewChild:
        return self.children[execution]

    def execution(self, key: DispatchKey) -> int:
        execution = self.state.dispatches[key].execution
        assert execution is not None
        return execution

    def ended(self, execution: int, status: str = "completed", result: Any = None) -> ChildEnded:
        c = self.children[execution]
        return ChildEnded(execution, c.task, c.iteration, c.index, status, result)

    def end(self, execution: int, status: str = "completed", result: Any = None) -> Step:
        return self.advance(self.ended(execution, status, result))

    def finish(self, name: str, result: Any = None, status: str = "completed", *, iteration: int = 0,
               index: int | None = None) -> Step:  # fmt: skip
        return self.end(self.execution((name, iteration, index)), status, result)

    def names(self, step: Step) -> list[str]:
        return [c.task for c in step.children]

    def key(self, name: str, iteration: int = 0) -> TaskKey:
        return (name, iteration)


def same(step: Step, **changes: Any) -> Step:
    return replace(step, **changes)
