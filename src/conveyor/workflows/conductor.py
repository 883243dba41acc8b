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

An advancement is plain functions of its working copy ``w`` (_working.py: the rows read,
what changed, the bookkeeping): this module reacts to each event (start, a child's end,
cancel, pause, resume, timeouts, rerun) and decides the end; _flow.py moves the task
instances (entering, joins, starting, settling, transitions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from conveyor.expressions import DEFAULT_LIMITS, Limits, Scope, item_vars
from conveyor.workflows._flow import (
    RETRIED,
    end_task,
    enter,
    item_results,
    parameters,
    ready,
    retry_delay,
    run_queue,
    settle,
)
from conveyor.workflows._working import TERMINAL, Stop, Working
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
    w = Working(spec, state, limits)
    # Every event first, then what they reached starts: arrivals at one task from
    # several events of this advancement make one instance (see _flow.arrive).
    for event in events:
        handle(w, event)
    run_queue(w)
    finish(w)
    return w.step()


def _order(key: DispatchKey) -> tuple[str, int, int]:
    return (key[0], key[1], -1 if key[2] is None else key[2])


def handle(w: Working, event: Event) -> None:
    if isinstance(event, Rerun):
        rerun(w, event)
    elif w.status in TERMINAL:
        return  # an ended workflow reacts to nothing but a rerun
    elif isinstance(event, Started):
        started(w, event)
    elif isinstance(event, ChildEnded):
        child_ended(w, event)
    elif isinstance(event, CancelRequested):
        cancel_requested(w, event)
    elif isinstance(event, PauseRequested):
        if w.status == "running":
            w.status = "paused"
    elif isinstance(event, ResumeRequested):
        resume(w)
    elif isinstance(event, TimedOut):
        if event.task is None:
            workflow_timed_out(w)
        else:
            task_timed_out(w, (event.task, event.iteration))


# -- start ------------------------------------------------------------------------


def started(w: Working, event: Started) -> None:
    if w.tasks or w.errors:
        return  # started already: a duplicate event
    w.context = dict(event.parameters)
    try:
        # Defaults see the inputs given (and earlier defaults); vars see all inputs.
        for spec_input in w.spec.input:
            if spec_input.name not in w.context and spec_input.has_default:
                where = f"input.{spec_input.name}"
                w.context[spec_input.name] = w.evaluate(spec_input.default, w.scope(), None, where)
        for name, value in w.spec.vars:
            w.context[name] = w.evaluate(value, w.scope(), None, f"vars.{name}")
    except Stop:
        return
    starts = w.spec.starts()
    if not starts:
        w.fail(None, "the workflow has no start task (every task has an inbound transition)", type="definition")
    for name in starts:
        enter(w, name, ())


# -- children ---------------------------------------------------------------------


def child_ended(w: Working, event: ChildEnded) -> None:
    key = (event.task, event.iteration, event.index)
    d = w.dispatch(key)
    if d is None or d.status != "running" or d.execution != event.execution:
        return  # a duplicate, or a child this chain already replaced: nothing to do
    task_key = (event.task, event.iteration)
    run = w.tasks.get(task_key)
    if run is None:
        return
    value, _ = child_value(event.status, event.result)
    status: DispatchStatus = "failed"
    if event.status == "completed":
        status = "succeeded"
    elif event.status == "cancelled" and w.canceling:
        status = "cancelled"  # cancelled by the workflow's cancel: no retry, no transition
    if status != "cancelled" and retry(w, d, task_key, value, status):
        return
    w.put_dispatch(replace(d, status=status, result=value))
    settle(w, task_key)


def retry(w: Working, d: Dispatch, task_key: TaskKey, value: Any, status: DispatchStatus) -> bool:
    """Request the chain's next child if the task's retry allows it: without ``when``
    after a failure, with ``when`` whenever it holds -- after a success too, as in
    Orquesta (polling: ``when: <% succeeded() and result().state = 'pending' %>``)."""
    spec = w.spec.tasks[d.task]
    policy, run = spec.retry, w.tasks[task_key]
    if policy is None or w.stopping or spec.action is None:
        return False
    if policy.when is None and status != "failed":
        return False
    item: dict[str, Any] = {}
    if d.index is not None and run.items is not None:
        var = spec.with_items.var if spec.with_items else None
        item = {"item": run.items[d.index], "index": d.index, "item_vars": item_vars(var)}
    try:
        scope = w.scope(result=value, status=status, **item)
        count = w.evaluate(policy.count, scope, task_key, "retry.count")
        if isinstance(count, str) and count.strip().isdigit():
            count = int(count)
        if not isinstance(count, int) or isinstance(count, bool):
            w.fail(task_key, f"retry.count: expected an integer, got {count!r}", where="retry.count")
            return False
        if d.retry >= count:
            return False
        if policy.when is not None and not w.evaluate(policy.when, scope, task_key, "retry.when"):
            return False
        params = parameters(w, task_key, spec, d.index, run.items)
    except Stop:
        return False
    child = NewChild(
        d.task, d.iteration, d.index, spec.action, params, d.retry + 1, retry_delay(policy, d.retry), spec.timeout
    )
    w.request(child, defer=w.paused)
    return True


# -- cancel, pause, resume --------------------------------------------------------


def running_dispatches(w: Working) -> list[DispatchKey]:
    keys = [k for tally in w.tallies.values() for k in tally.running]
    return sorted(keys, key=_order)


def cancel_requested(w: Working, event: CancelRequested) -> None:
    w.status = "canceling"
    for key in running_dispatches(w):
        d = w.dispatch(key)
        assert d is not None
        if d.execution is None:
            w.put_dispatch(replace(d, status="cancelled"))  # deferred or not created yet
        elif event.policy == "cancel_running":
            w.cancel[d.execution] = None
    for task_key, run in list(w.tasks.items()):
        if run.status == "waiting":
            w.update_task(task_key, status="cancelled")
        elif run.status == "running":
            settle(w, task_key)


def resume(w: Working) -> None:
    if w.status != "paused":
        return
    w.status = "running"
    for key in sorted(w.deferred, key=_order):
        d = w.dispatch(key)
        spec = w.spec.tasks[key[0]]
        if d is None or d.status != "running" or spec.action is None:
            continue
        task_key = (key[0], key[1])
        if w.stopping:  # failing: the deferred retry is not made, its chain failed
            w.put_dispatch(replace(d, status="failed"))
            continue
        try:
            params = parameters(w, task_key, spec, key[2], w.tasks[task_key].items)
        except Stop:
            w.put_dispatch(replace(d, status="failed"))
            continue
        used = max(d.retry - 1, 0)
        delay = retry_delay(spec.retry, used) if spec.retry else 0.0
        w.request(NewChild(key[0], key[1], key[2], spec.action, params, d.retry, delay, spec.timeout))
    for task_key, run in sorted(w.tasks.items()):
        if run.status == "waiting" and ready(w, run):
            w.to_start.append((task_key, False))
        elif run.status == "running":
            settle(w, task_key)


# -- timeouts ---------------------------------------------------------------------


def cut(w: Working, keys: list[DispatchKey]) -> None:
    """Cancel these running children and end their dispatches now: their own
    ChildEnded, when it comes, finds the dispatch ended and is ignored."""
    for key in keys:
        d = w.dispatch(key)
        assert d is not None
        if d.execution is not None:
            w.cancel[d.execution] = None
        w.put_dispatch(replace(d, status="cancelled"))


def workflow_timed_out(w: Working) -> None:
    cut(w, running_dispatches(w))
    for key, run in list(w.tasks.items()):
        if run.status in ("waiting", "running"):
            w.update_task(key, status="cancelled")
    limit = f" after {w.spec.timeout:g} s" if w.spec.timeout is not None else ""
    w.fail(None, f"the workflow {w.spec.ref} timed out{limit}", type="timeout", timeout=w.spec.timeout)
    w.status = "failed"


def task_timed_out(w: Working, key: TaskKey) -> None:
    run = w.tasks.get(key)
    if run is None or run.status != "running":
        return
    cut(w, sorted(w.tally(key).running, key=_order))
    error = f"task {run.name!r} timed out"
    result: Any = {"error": error} if run.items_total is None else item_results(w, run, run.items_total)[0]
    end_task(w, key, "failed", result, error)  # no retry: the task's time is up


# -- rerun ------------------------------------------------------------------------


def rerun(w: Working, event: Rerun) -> None:
    """The state was copied from the failed execution (rerun_execution, migration
    0013): start each listed failed instance again, as a new iteration. Only an
    instance that is still its task's latest is started, so a replayed event starts
    nothing twice."""
    if w.status not in TERMINAL and w.status != "running":
        return
    ended = w.status in TERMINAL
    listed = set(event.tasks)
    again = [
        w.tasks[k] for k in event.tasks if k in w.tasks and w.tasks[k].status == "failed" and w.latest.get(k[0]) == k[1]
    ]
    if not again and not ended:
        return  # nothing failed is left to start (a replay): the end is decided as usual
    w.status = "running"
    w.errors = []
    if not again:
        names = ", ".join(f"{name}#{iteration}" for name, iteration in event.tasks) or "none"
        w.fail(None, f"nothing to rerun: no failed task instance among {names}", type="rerun")
        return
    for key, run in sorted(w.tasks.items()):
        if run.status == "failed" and key not in listed and not ready(w, run):
            w.update_task(key, status="waiting", error=None)  # a join that could not fire waits again
    for run in again:
        before = w.latest.get(run.name)
        # A fresh start: the retry command's attempts are counted again.
        enter(w, run.name, tuple(a for a in run.arrivals if a != RETRIED))
        if w.latest.get(run.name) != before:  # listed: it starts, even a join short of arrivals
            w.to_start.append(((run.name, w.latest[run.name]), False))
    # What was reached but not started because the workflow was failing starts now.
    for key, run in sorted(w.tasks.items()):
        if run.status == "waiting" and ready(w, run):
            w.to_start.append((key, False))


# -- the end ----------------------------------------------------------------------


def finish(w: Working) -> None:
    """End the workflow once nothing of it runs (a paused one stays paused)."""
    if w.status in TERMINAL or w.paused:
        return
    if any(run.status == "running" for run in w.tasks.values()):
        return
    failing = bool(w.errors)
    for key, run in sorted(w.tasks.items()):
        if run.status != "waiting":
            continue
        if w.canceling:
            w.update_task(key, status="cancelled")
        elif failing or ready(w, run):
            # Reached but not started because the workflow is failing (ready is only
            # possible then): it stays waiting, and a rerun starts it.
            continue
        else:
            # Orquesta's unreachable join: the workflow is over, the join cannot fire.
            arrived = sorted(set(run.arrivals) & w.inbound(run.name))
            message = f"join of task {run.name!r} can never be satisfied: only {arrived or 'none'} arrived"
            w.update_task(key, status="failed", error=message)
            w.fail(key, message, type="join")
    if w.canceling:
        w.status = "cancelled"
    elif w.errors:
        w.status = "failed"
    else:
        end_with_output(w)


def end_with_output(w: Working) -> None:
    output: dict[str, Any] = {}
    try:
        for name, value in w.spec.output:
            scope = Scope(ctx={**w.context, **output}, tasks=w.tasks_view())  # later see earlier
            output[name] = w.evaluate(value, scope, None, f"output.{name}")
    except Stop:
        w.status = "failed"
        return
    w.status = "succeeded"
    w.output = output
