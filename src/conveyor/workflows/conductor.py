"""The workflow conductor: what a workflow does next, as a pure function.

``advance(spec, state, events) -> Step``: the executor loads the workflow's rows
(:class:`~conveyor.workflows.state.WorkflowState`) and the events since the last
advancement, calls this inside the transaction that holds the workflow's lock, and
applies the :class:`~conveyor.workflows.state.Step`. No database, no clock, no I/O: the
same rows and events always give the same decision, so an advancement that is retried
after a crash decides the same thing, and a duplicate event decides nothing.

Orquesta's conductor is the model (a state machine over task states and transitions);
docs/workflow-semantics.md states the semantics, with the choices made where Orquesta's
are implicit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from conveyor.expressions import DEFAULT_LIMITS, Limits, Scope, item_vars
from conveyor.workflows._flow import RETRIED, Flow, retry_delay
from conveyor.workflows._working import TERMINAL, Stop
from conveyor.workflows.childresult import child_value
from conveyor.workflows.spec import WorkflowSpec
from conveyor.workflows.state import (
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
    TimedOut,
    WorkflowState,
)

__all__ = ["advance"]


def advance(spec: WorkflowSpec, state: WorkflowState, events: Sequence[Event], limits: Limits = DEFAULT_LIMITS) -> Step:
    """Apply ``events`` in order to ``state`` and decide what follows (expressions
    evaluated within ``limits``)."""
    conductor = _Conductor(spec, state, limits)
    # Every event first, then what they reached starts: arrivals at one task from
    # several events of this advancement make one instance (see Flow.arrive).
    for event in events:
        conductor.handle(event)
    conductor.run_queue()
    conductor.finish()
    return conductor.step()


def _order(key: DispatchKey) -> tuple[str, int, int]:
    return (key[0], key[1], -1 if key[2] is None else key[2])


class _Conductor(Flow):
    def handle(self, event: Event) -> None:
        if isinstance(event, Rerun):
            self.rerun(event)
        elif self.status in TERMINAL:
            return  # an ended workflow reacts to nothing but a rerun
        elif isinstance(event, Started):
            self.started(event)
        elif isinstance(event, ChildEnded):
            self.child_ended(event)
        elif isinstance(event, CancelRequested):
            self.cancel_requested(event)
        elif isinstance(event, PauseRequested):
            if self.status == "running":
                self.status = "paused"
        elif isinstance(event, ResumeRequested):
            self.resume()
        elif isinstance(event, TimedOut):
            if event.task is None:
                self.workflow_timed_out()
            else:
                self.task_timed_out((event.task, event.iteration))

    # -- start ------------------------------------------------------------------------

    def started(self, event: Started) -> None:
        if self.tasks or self.errors:
            return  # started already: a duplicate event
        self.context = dict(event.parameters)
        try:
            # Defaults see the inputs given (and earlier defaults); vars see all inputs.
            for spec_input in self.spec.input:
                if spec_input.name not in self.context and spec_input.has_default:
                    where = f"input.{spec_input.name}"
                    self.context[spec_input.name] = self.evaluate(spec_input.default, self.scope(), None, where)
            for name, value in self.spec.vars:
                self.context[name] = self.evaluate(value, self.scope(), None, f"vars.{name}")
        except Stop:
            return
        starts = self.spec.starts()
        if not starts:
            self.fail(None, "the workflow has no start task (every task has an inbound transition)", type="definition")
        for name in starts:
            self.enter(name, ())

    # -- children ---------------------------------------------------------------------

    def child_ended(self, event: ChildEnded) -> None:
        key = (event.task, event.iteration, event.index)
        d = self.dispatch(key)
        if d is None or d.status != "running" or d.execution != event.execution:
            return  # a duplicate, or a child this chain already replaced: nothing to do
        task_key = (event.task, event.iteration)
        run = self.tasks.get(task_key)
        if run is None:
            return
        value, _ = child_value(event.status, event.result)
        status: DispatchStatus = "failed"
        if event.status == "completed":
            status = "succeeded"
        elif event.status == "cancelled" and self.canceling:
            status = "cancelled"  # cancelled by the workflow's cancel: no retry, no transition
        if status != "cancelled" and self.retry(d, task_key, value, status):
            return
        self.put_dispatch(replace(d, status=status, result=value))
        self.settle(task_key)

    def retry(self, d: Dispatch, task_key: TaskKey, value: Any, status: DispatchStatus) -> bool:
        """Request the chain's next child if the task's retry allows it: without ``when``
        after a failure, with ``when`` whenever it holds -- after a success too, as in
        Orquesta (polling: ``when: <% succeeded() and result().state = 'pending' %>``)."""
        spec = self.spec.tasks[d.task]
        policy, run = spec.retry, self.tasks[task_key]
        if policy is None or self.stopping or spec.action is None:
            return False
        if policy.when is None and status != "failed":
            return False
        item: dict[str, Any] = {}
        if d.index is not None and run.items is not None:
            var = spec.with_items.var if spec.with_items else None
            item = {"item": run.items[d.index], "index": d.index, "item_vars": item_vars(var)}
        try:
            scope = self.scope(result=value, status=status, **item)
            count = self.evaluate(policy.count, scope, task_key, "retry.count")
            if isinstance(count, str) and count.strip().isdigit():
                count = int(count)
            if not isinstance(count, int) or isinstance(count, bool):
                self.fail(task_key, f"retry.count: expected an integer, got {count!r}", where="retry.count")
                return False
            if d.retry >= count:
                return False
            if policy.when is not None and not self.evaluate(policy.when, scope, task_key, "retry.when"):
                return False
            params = self.parameters(task_key, spec, d.index, run.items)
        except Stop:
            return False
        child = NewChild(d.task, d.iteration, d.index, spec.action, params, d.retry + 1,
                         retry_delay(policy, d.retry), spec.timeout)  # fmt: skip
        self.request(child, defer=self.paused)
        return True

    # -- cancel, pause, resume --------------------------------------------------------

    def running_dispatches(self) -> list[DispatchKey]:
        keys = [k for tally in self.tallies.values() for k in tally.running]
        return sorted(keys, key=_order)

    def cancel_requested(self, event: CancelRequested) -> None:
        self.status = "canceling"
        for key in self.running_dispatches():
            d = self.dispatch(key)
            assert d is not None
            if d.execution is None:
                self.put_dispatch(replace(d, status="cancelled"))  # deferred or not created yet
            elif event.policy == "cancel_running":
                self.cancel[d.execution] = None
        for task_key, run in list(self.tasks.items()):
            if run.status == "waiting":
                self.update_task(task_key, status="cancelled")
            elif run.status == "running":
                self.settle(task_key)

    def resume(self) -> None:
        if self.status != "paused":
            return
        self.status = "running"
        for key in sorted(self.deferred, key=_order):
            d = self.dispatch(key)
            spec = self.spec.tasks[key[0]]
            if d is None or d.status != "running" or spec.action is None:
                continue
            task_key = (key[0], key[1])
            if self.stopping:  # failing: the deferred retry is not made, its chain failed
                self.put_dispatch(replace(d, status="failed"))
                continue
            try:
                params = self.parameters(task_key, spec, key[2], self.tasks[task_key].items)
            except Stop:
                self.put_dispatch(replace(d, status="failed"))
                continue
            used = max(d.retry - 1, 0)
            delay = retry_delay(spec.retry, used) if spec.retry else 0.0
            self.request(NewChild(key[0], key[1], key[2], spec.action, params, d.retry, delay, spec.timeout))
        for task_key, run in sorted(self.tasks.items()):
            if run.status == "waiting" and self.ready(run):
                self.to_start.append((task_key, False))
            elif run.status == "running":
                self.settle(task_key)

    # -- timeouts ---------------------------------------------------------------------

    def cut(self, keys: list[DispatchKey]) -> None:
        """Cancel these running children and end their dispatches now: their own
        ChildEnded, when it comes, finds the dispatch ended and is ignored."""
        for key in keys:
            d = self.dispatch(key)
            assert d is not None
            if d.execution is not None:
                self.cancel[d.execution] = None
            self.put_dispatch(replace(d, status="cancelled"))

    def workflow_timed_out(self) -> None:
        self.cut(self.running_dispatches())
        for key, run in list(self.tasks.items()):
            if run.status in ("waiting", "running"):
                self.update_task(key, status="cancelled")
        limit = f" after {self.spec.timeout:g} s" if self.spec.timeout is not None else ""
        self.fail(None, f"the workflow {self.spec.ref} timed out{limit}", type="timeout", timeout=self.spec.timeout)
        self.status = "failed"

    def task_timed_out(self, key: TaskKey) -> None:
        run = self.tasks.get(key)
        if run is None or run.status != "running":
            return
        self.cut(sorted(self.tally(key).running, key=_order))
        error = f"task {run.name!r} timed out"
        result: Any = {"error": error} if run.items_total is None else self.item_results(run, run.items_total)[0]
        self.end_task(key, "failed", result, error)  # no retry: the task's time is up

    # -- rerun ------------------------------------------------------------------------

    def rerun(self, event: Rerun) -> None:
        """The state was copied from the failed execution (rerun_execution, migration
        0013): start each listed failed instance again, as a new iteration. Only an
        instance that is still its task's latest is started, so a replayed event starts
        nothing twice."""
        if self.status not in TERMINAL and self.status != "running":
            return
        ended = self.status in TERMINAL
        listed = set(event.tasks)
        again = [self.tasks[k] for k in event.tasks
                 if k in self.tasks and self.tasks[k].status == "failed" and self.latest.get(k[0]) == k[1]]  # fmt: skip
        if not again and not ended:
            return  # nothing failed is left to start (a replay): the end is decided as usual
        self.status = "running"
        self.errors = []
        if not again:
            names = ", ".join(f"{name}#{iteration}" for name, iteration in event.tasks) or "none"
            self.fail(None, f"nothing to rerun: no failed task instance among {names}", type="rerun")
            return
        for key, run in sorted(self.tasks.items()):
            if run.status == "failed" and key not in listed and not self.ready(run):
                self.update_task(key, status="waiting", error=None)  # a join that could not fire waits again
        for run in again:
            before = self.latest.get(run.name)
            # A fresh start: the retry command's attempts are counted again.
            self.enter(run.name, tuple(a for a in run.arrivals if a != RETRIED))
            if self.latest.get(run.name) != before:  # listed: it starts, even a join short of arrivals
                self.to_start.append(((run.name, self.latest[run.name]), False))
        # What was reached but not started because the workflow was failing starts now.
        for key, run in sorted(self.tasks.items()):
            if run.status == "waiting" and self.ready(run):
                self.to_start.append((key, False))

    # -- the end ----------------------------------------------------------------------

    def finish(self) -> None:
        """End the workflow once nothing of it runs (a paused one stays paused)."""
        if self.status in TERMINAL or self.paused:
            return
        if any(run.status == "running" for run in self.tasks.values()):
            return
        failing = bool(self.errors)
        for key, run in sorted(self.tasks.items()):
            if run.status != "waiting":
                continue
            if self.canceling:
                self.update_task(key, status="cancelled")
            elif failing or self.ready(run):
                # Reached but not started because the workflow is failing (ready is only
                # possible then): it stays waiting, and a rerun starts it.
                continue
            else:
                # Orquesta's unreachable join: the workflow is over, the join cannot fire.
                arrived = sorted(set(run.arrivals) & self.inbound(run.name))
                message = f"join of task {run.name!r} can never be satisfied: only {arrived or 'none'} arrived"
                self.update_task(key, status="failed", error=message)
                self.fail(key, message, type="join")
        if self.canceling:
            self.status = "cancelled"
        elif self.errors:
            self.status = "failed"
        else:
            self.end_with_output()

    def end_with_output(self) -> None:
        output: dict[str, Any] = {}
        try:
            for name, value in self.spec.output:
                scope = Scope(ctx={**self.context, **output}, tasks=self.tasks_view())  # later see earlier
                output[name] = self.evaluate(value, scope, None, f"output.{name}")
        except Stop:
            self.status = "failed"
            return
        self.status = "succeeded"
        self.output = output
