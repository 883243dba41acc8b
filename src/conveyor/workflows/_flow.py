"""Task instances: entering, joins, starting (one child, ``with`` items, or none),
settling once their children ended, and the transitions that follow.

Functions of the advancement's working copy ``w`` (:class:`~conveyor.workflows._working.Working`),
called by the conductor's event handlers (conductor.py) and by each other."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conveyor.expressions import Scope, item_vars
from conveyor.workflows._working import Stop, Working
from conveyor.workflows.childresult import error_of
from conveyor.workflows.spec import COMMANDS, RetrySpec, TaskSpec
from conveyor.workflows.state import NewChild, TaskKey, TaskRun, TaskStatus

# Orquesta's composer turns ``do: retry`` into ``retry: {count: 3}`` (composers/native.py).
RETRY_COMMAND_COUNT = 3
RETRIED = "retry"  # in a task instance's arrivals: one attempt of the retry command


def retry_delay(retry: RetrySpec, used: int) -> float:
    """The wait before retry number ``used + 1``: delay * backoff**used, capped."""
    delay = float(retry.delay) * float(retry.backoff) ** used
    return delay if retry.max_delay is None else min(delay, float(retry.max_delay))


def _positive_int(value: Any) -> int | None:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


def ready(w: Working, run: TaskRun) -> bool:
    """Whether the instance's join (if any) is satisfied by its arrivals."""
    join = w.spec.tasks[run.name].join
    if join is None:
        return True
    inbound = w.inbound(run.name)
    need = len(inbound) if join == "all" else int(join)
    return len(set(run.arrivals) & inbound) >= need


def may_start(w: Working, force: bool) -> bool:
    """New work starts unless paused (deferred) or stopping. ``force``: a task named
    next to ``fail`` in a transition (Orquesta's remediation: cleanup then fail)."""
    if w.paused:
        return False
    return not w.stopping or (force and not w.canceling and w.status == "running")


# -- entering ---------------------------------------------------------------------


def enter(w: Working, name: str, arrivals: tuple[str, ...], force: bool = False) -> None:
    """A new instance of ``name`` (the next iteration): waiting, and queued to start
    if its join is satisfied."""
    iteration = w.latest.get(name, -1) + 1
    if iteration >= w.spec.max_iterations:
        w.fail(
            (name, iteration),
            f"task {name!r} would run more than {w.spec.max_iterations} times (max_iterations)",
            type="iterations",
        )
        return
    run = w.put_task(TaskRun(name, iteration, "waiting", arrivals))
    if ready(w, run):
        w.to_start.append(((name, iteration), force))


def arrive(w: Working, target: str, source: TaskKey, force: bool) -> None:
    """A transition from ``source`` reached ``target``."""
    if target not in w.spec.tasks:
        w.fail(source, f"'do' names an unknown task {target!r}")
        return
    if w.canceling:
        return  # a cancelled workflow goes nowhere
    # Paused or failing: the arrival is recorded and what it would start waits (for
    # the resume, or for a rerun of the failed workflow: Orquesta's continuation).
    name = source[0]
    if w.spec.tasks[target].join is None:
        last = (target, w.latest.get(target, -1))
        staged = w.tasks.get(last)
        if staged is not None and staged.status == "waiting":
            # Reached again before it started (in this advancement, or held while
            # paused or failing): the same instance, as Orquesta merges an arrival
            # into the task it staged. Otherwise a cycle beside a fork, whose branches
            # all come back, doubled the cycle's instances at each turn.
            w.update_task(last, arrivals=(*staged.arrivals, name))
            if force:
                w.to_start.append((last, force))
            return
        enter(w, target, (name,), force)
        return
    latest = w.latest.get(target)
    if latest is not None:
        run = w.tasks[(target, latest)]
        # A waiting join collects every arrival; one that fired records late arrivals
        # (ignored: a join fires once) until the same inbound task arrives again,
        # which opens the next iteration (a cycle through the join).
        if run.status == "waiting" or name not in run.arrivals:
            run = w.update_task((target, latest), arrivals=(*run.arrivals, name))
            if run.status == "waiting" and ready(w, run):
                w.to_start.append(((target, latest), force))
            return
    enter(w, target, (name,), force)


def run_queue(w: Working) -> None:
    while w.to_start:
        key, force = w.to_start.popleft()
        start(w, key, force)


# -- starting ---------------------------------------------------------------------


def start(w: Working, key: TaskKey, force: bool = False) -> None:
    run = w.tasks[key]
    if run.status != "waiting" or not may_start(w, force):
        return  # already started, or deferred (paused) / dropped (ending) while waiting
    spec = w.spec.tasks[run.name]
    try:
        if spec.action is None:
            end_task(w, key, "succeeded", None, None)
        elif spec.with_items is not None:
            start_items(w, key, run, spec)
        else:
            params = parameters(w, key, spec, None, None)
            w.put_task(replace(run, status="running"))
            w.request(
                NewChild(run.name, run.iteration, None, spec.action, params, 0, float(spec.delay or 0.0), spec.timeout)
            )
    except Stop:
        w.update_task(key, status="failed", error=w.errors[-1]["message"])


def parameters(w: Working, key: TaskKey, spec: TaskSpec, index: int | None, items: list[Any] | None) -> dict[str, Any]:
    if index is None or items is None:
        scope = w.scope()
    else:
        var = spec.with_items.var if spec.with_items else None
        scope = w.scope(item=items[index], index=index, item_vars=item_vars(var))
    where = "input" if index is None else f"input (item {index})"
    params = w.evaluate(spec.input, scope, key, where)
    if not isinstance(params, dict):
        w.fail(key, f"{where}: expected a mapping, got {type(params).__name__}", where=where)
        raise Stop
    return params


def start_items(w: Working, key: TaskKey, run: TaskRun, spec: TaskSpec) -> None:
    assert spec.with_items is not None
    each = spec.with_items
    items = w.evaluate(each.items, w.scope(), key, "with.items")
    if isinstance(items, tuple):
        items = list(items)
    if not isinstance(items, list):
        expression = each.items if isinstance(each.items, str) else None
        w.fail(
            key, f"with.items: expected a list, got {type(items).__name__}", expression=expression, where="with.items"
        )
        raise Stop
    concurrency = None
    if each.concurrency is not None:
        value = w.evaluate(each.concurrency, w.scope(), key, "with.concurrency")
        concurrency = _positive_int(value)
        if concurrency is None:
            w.fail(key, f"with.concurrency: expected a positive integer, got {value!r}", where="with.concurrency")
            raise Stop
    w.put_task(replace(run, status="running", items_total=len(items), items=items, concurrency=concurrency))
    if not items:
        end_task(w, key, "succeeded", [], None)
        return
    settle(w, key, delay=float(spec.delay or 0.0))


# -- settling ---------------------------------------------------------------------


def settle(w: Working, key: TaskKey, delay: float = 0.0) -> None:
    """Dispatch the next items if room, and end the instance once nothing of it runs."""
    run = w.tasks[key]
    if run.status != "running":
        return
    spec = w.spec.tasks[run.name]
    tally = w.tally(key)
    if run.items_total is None:
        if not tally.running:
            d = w.dispatch((run.name, run.iteration, None))
            assert d is not None
            status: TaskStatus = "failed"
            if d.status in ("succeeded", "cancelled"):
                status = "succeeded" if d.status == "succeeded" else "cancelled"
            error = error_of(d.result) or f"task {run.name!r} failed"
            end_task(w, key, status, d.result, error if status == "failed" else None)
        return
    total = run.items_total
    if not w.stopping and not w.paused and not tally.failed and run.error is None:
        try:
            top_up(w, key, run, spec, total, delay)
        except Stop:
            run = w.update_task(key, error=w.errors[-1]["message"])
    if tally.running:
        return
    if tally.failed:
        results, first = item_results(w, run, total)
        end_task(
            w,
            key,
            "failed",
            results,
            f"{tally.failed} of {total} items failed; item {first}: {error_of(results[first])}",
        )
    elif tally.dispatched >= total:
        end_task(w, key, "succeeded", item_results(w, run, total)[0], None)
    elif run.error is not None:
        end_task(w, key, "failed", item_results(w, run, total)[0], run.error)
    elif w.stopping:
        end_task(w, key, "cancelled", item_results(w, run, total)[0], None)
    # else paused with items left: resumed later


def top_up(w: Working, key: TaskKey, run: TaskRun, spec: TaskSpec, total: int, delay: float) -> None:
    assert spec.action is not None
    assert run.items is not None
    tally = w.tally(key)
    limit = total if run.concurrency is None else run.concurrency
    while len(tally.running) < limit and tally.dispatched < total:
        index = tally.dispatched
        params = parameters(w, key, spec, index, run.items)
        w.request(NewChild(run.name, run.iteration, index, spec.action, params, 0, delay, spec.timeout))


def item_results(w: Working, run: TaskRun, total: int) -> tuple[list[Any], int]:
    """Item results in item order (None for an item that never ran), and the index of
    the first failed item (-1 if none). Once per ``with`` instance, when it ends."""
    results: list[Any] = []
    first = -1
    for index in range(total):
        d = w.dispatch((run.name, run.iteration, index))
        results.append(None if d is None else d.result)
        if first < 0 and d is not None and d.status == "failed":
            first = index
    return results, first


# -- ending -----------------------------------------------------------------------


def end_task(w: Working, key: TaskKey, status: TaskStatus, result: Any, error: str | None) -> None:
    run = w.update_task(key, status=status, result=result, error=error)
    if status == "cancelled" or w.canceling:
        return  # a cancelled task, or any task of a cancelled workflow: no transitions
    transitions(w, key, run)


def transitions(w: Working, key: TaskKey, run: TaskRun) -> None:
    """Every ``next`` entry whose ``when`` holds: publish in order, then ``do``.
    A failed task that no entry matched fails the workflow (Orquesta: unhandled).
    The ``retry`` command comes first: while it retries, no entry is followed."""
    spec = w.spec.tasks[run.name]
    matched, failing = False, False
    targets: list[str] = []
    try:
        if retry_command(w, key, run):
            return
        for n, tr in enumerate(spec.next):
            do = [t for t in tr.do if t != RETRIED]
            if tr.do and not do:
                continue  # only the retry command: not a transition (Orquesta draws no edge for it)
            if tr.when is not None and not w.evaluate(tr.when, _after(w, run), key, f"next[{n}].when"):
                continue
            matched = True
            for name, value in tr.publish:
                # A fresh scope each time: later entries see earlier ones.
                w.context[name] = w.evaluate(value, _after(w, run), key, f"next[{n}].publish.{name}")
            for target in do:
                if target == "fail":
                    failing = True
                elif target not in COMMANDS:  # continue, noop: nothing
                    targets.append(target)
    except Stop:
        return
    if failing:
        w.fail(key, f"task {run.name!r} failed the workflow ('fail' in its transitions)", type="fail")
    elif run.status == "failed" and not matched:
        w.fail(key, run.error or f"task {run.name!r} failed", type="task")
    for target in targets:
        arrive(w, target, key, force=failing)


def retry_command(w: Working, key: TaskKey, run: TaskRun) -> bool:
    """``do: retry`` as Orquesta reads it: not a transition but the task's retry policy,
    ``{when: <the entry's when, or completed()>, count: 3}`` (the last such entry wins).
    It runs the task again as a new iteration, at most :data:`RETRY_COMMAND_COUNT`
    times in a row, and the task's transitions are followed only after the last
    attempt. Unbounded (as it was: every end re-entered the task), ``do: retry``
    without ``when`` ran a task ``max_iterations`` times where Orquesta runs it 4."""
    entries = [(n, tr) for n, tr in enumerate(w.spec.tasks[run.name].next) if RETRIED in tr.do]
    if not entries or w.stopping or run.arrivals.count(RETRIED) >= RETRY_COMMAND_COUNT:
        return False
    n, tr = entries[-1]
    if tr.when is not None and not w.evaluate(tr.when, _after(w, run), key, f"next[{n}].when"):
        return False
    # The marker counts the attempts on the instance itself (no task is named "retry").
    enter(w, run.name, (*run.arrivals, RETRIED))
    return True


def _after(w: Working, run: TaskRun) -> Scope:
    return w.scope(result=run.result, status=run.status)
