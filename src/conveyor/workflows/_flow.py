"""Task instances: entering, joins, starting (one child, ``with`` items, or none),
settling once their children ended, and the transitions that follow."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conveyor.expressions import item_vars
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


class Flow(Working):
    _inbound: dict[str, frozenset[str]]

    def inbound(self, name: str) -> frozenset[str]:
        """The distinct tasks with a transition to ``name``: a join waits for one arrival
        from each (Orquesta counts inbound tasks, so a task routing both its success and
        its failure to the join counts once)."""
        cache = getattr(self, "_inbound", None)
        if cache is None:
            cache = self._inbound = {}
        if name not in cache:
            cache[name] = frozenset(self.spec.inbound(name))
        return cache[name]

    def ready(self, run: TaskRun) -> bool:
        join = self.spec.tasks[run.name].join
        if join is None:
            return True
        inbound = self.inbound(run.name)
        need = len(inbound) if join == "all" else int(join)
        return len(set(run.arrivals) & inbound) >= need

    def may_start(self, force: bool) -> bool:
        """New work starts unless paused (deferred) or stopping. ``force``: a task named
        next to ``fail`` in a transition (Orquesta's remediation: cleanup then fail)."""
        if self.paused:
            return False
        return not self.stopping or (force and not self.canceling and self.status == "running")

    # -- entering ---------------------------------------------------------------------

    def enter(self, name: str, arrivals: tuple[str, ...], force: bool = False) -> None:
        """A new instance of ``name`` (the next iteration): waiting, and queued to start
        if its join is satisfied."""
        iteration = self.latest.get(name, -1) + 1
        if iteration >= self.spec.max_iterations:
            self.fail((name, iteration), f"task {name!r} would run more than {self.spec.max_iterations} times "
                      "(max_iterations)", type="iterations")  # fmt: skip
            return
        run = self.put_task(TaskRun(name, iteration, "waiting", arrivals))
        if self.ready(run):
            self.to_start.append(((name, iteration), force))

    def arrive(self, target: str, source: TaskKey, force: bool) -> None:
        """A transition from ``source`` reached ``target``."""
        if target not in self.spec.tasks:
            self.fail(source, f"'do' names an unknown task {target!r}")
            return
        if self.canceling:
            return  # a cancelled workflow goes nowhere
        # Paused or failing: the arrival is recorded and what it would start waits (for
        # the resume, or for a rerun of the failed workflow: Orquesta's continuation).
        name = source[0]
        if self.spec.tasks[target].join is None:
            last = (target, self.latest.get(target, -1))
            staged = self.tasks.get(last)
            if staged is not None and staged.status == "waiting":
                # Reached again before it started (in this advancement, or held while
                # paused or failing): the same instance, as Orquesta merges an arrival
                # into the task it staged. Otherwise a cycle beside a fork, whose branches
                # all come back, doubled the cycle's instances at each turn.
                self.update_task(last, arrivals=(*staged.arrivals, name))
                if force:
                    self.to_start.append((last, force))
                return
            self.enter(target, (name,), force)
            return
        latest = self.latest.get(target)
        if latest is not None:
            run = self.tasks[(target, latest)]
            # A waiting join collects every arrival; one that fired records late arrivals
            # (ignored: a join fires once) until the same inbound task arrives again,
            # which opens the next iteration (a cycle through the join).
            if run.status == "waiting" or name not in run.arrivals:
                run = self.update_task((target, latest), arrivals=(*run.arrivals, name))
                if run.status == "waiting" and self.ready(run):
                    self.to_start.append(((target, latest), force))
                return
        self.enter(target, (name,), force)

    def run_queue(self) -> None:
        while self.to_start:
            key, force = self.to_start.popleft()
            self.start(key, force)

    # -- starting ---------------------------------------------------------------------

    def start(self, key: TaskKey, force: bool = False) -> None:
        run = self.tasks[key]
        if run.status != "waiting" or not self.may_start(force):
            return  # already started, or deferred (paused) / dropped (ending) while waiting
        spec = self.spec.tasks[run.name]
        try:
            if spec.action is None:
                self.end_task(key, "succeeded", None, None)
            elif spec.with_items is not None:
                self.start_items(key, run, spec)
            else:
                params = self.parameters(key, spec, None, None)
                self.put_task(replace(run, status="running"))
                self.request(NewChild(run.name, run.iteration, None, spec.action, params, 0,
                                      float(spec.delay or 0.0), spec.timeout))  # fmt: skip
        except Stop:
            self.update_task(key, status="failed", error=self.errors[-1]["message"])

    def parameters(self, key: TaskKey, spec: TaskSpec, index: int | None, items: list[Any] | None) -> dict[str, Any]:
        if index is None or items is None:
            scope = self.scope()
        else:
            var = spec.with_items.var if spec.with_items else None
            scope = self.scope(item=items[index], index=index, item_vars=item_vars(var))
        where = "input" if index is None else f"input (item {index})"
        params = self.evaluate(spec.input, scope, key, where)
        if not isinstance(params, dict):
            self.fail(key, f"{where}: expected a mapping, got {type(params).__name__}", where=where)
            raise Stop
        return params

    def start_items(self, key: TaskKey, run: TaskRun, spec: TaskSpec) -> None:
        assert spec.with_items is not None
        w = spec.with_items
        items = self.evaluate(w.items, self.scope(), key, "with.items")
        if isinstance(items, tuple):
            items = list(items)
        if not isinstance(items, list):
            expression = w.items if isinstance(w.items, str) else None
            self.fail(key, f"with.items: expected a list, got {type(items).__name__}", expression=expression,
                      where="with.items")  # fmt: skip
            raise Stop
        concurrency = None
        if w.concurrency is not None:
            value = self.evaluate(w.concurrency, self.scope(), key, "with.concurrency")
            concurrency = _positive_int(value)
            if concurrency is None:
                self.fail(key, f"with.concurrency: expected a positive integer, got {value!r}",
                          where="with.concurrency")  # fmt: skip
                raise Stop
        self.put_task(replace(run, status="running", items_total=len(items), items=items, concurrency=concurrency))
        if not items:
            self.end_task(key, "succeeded", [], None)
            return
        self.settle(key, delay=float(spec.delay or 0.0))

    # -- settling ---------------------------------------------------------------------

    def settle(self, key: TaskKey, delay: float = 0.0) -> None:
        """Dispatch the next items if room, and end the instance once nothing of it runs."""
        run = self.tasks[key]
        if run.status != "running":
            return
        spec = self.spec.tasks[run.name]
        tally = self.tally(key)
        if run.items_total is None:
            if not tally.running:
                d = self.dispatch((run.name, run.iteration, None))
                assert d is not None
                status: TaskStatus = "failed"
                if d.status in ("succeeded", "cancelled"):
                    status = "succeeded" if d.status == "succeeded" else "cancelled"
                error = error_of(d.result) or f"task {run.name!r} failed"
                self.end_task(key, status, d.result, error if status == "failed" else None)
            return
        total = run.items_total
        if not self.stopping and not self.paused and not tally.failed and run.error is None:
            try:
                self.top_up(key, run, spec, total, delay)
            except Stop:
                run = self.update_task(key, error=self.errors[-1]["message"])
        if tally.running:
            return
        if tally.failed:
            results, first = self.item_results(run, total)
            self.end_task(key, "failed", results, f"{tally.failed} of {total} items failed; item {first}: "
                          f"{error_of(results[first])}")  # fmt: skip
        elif tally.dispatched >= total:
            self.end_task(key, "succeeded", self.item_results(run, total)[0], None)
        elif run.error is not None:
            self.end_task(key, "failed", self.item_results(run, total)[0], run.error)
        elif self.stopping:
            self.end_task(key, "cancelled", self.item_results(run, total)[0], None)
        # else paused with items left: resumed later

    def top_up(self, key: TaskKey, run: TaskRun, spec: TaskSpec, total: int, delay: float) -> None:
        assert spec.action is not None
        assert run.items is not None
        tally = self.tally(key)
        limit = total if run.concurrency is None else run.concurrency
        while len(tally.running) < limit and tally.dispatched < total:
            index = tally.dispatched
            params = self.parameters(key, spec, index, run.items)
            self.request(NewChild(run.name, run.iteration, index, spec.action, params, 0, delay, spec.timeout))

    def item_results(self, run: TaskRun, total: int) -> tuple[list[Any], int]:
        """Item results in item order (None for an item that never ran), and the index of
        the first failed item (-1 if none). Once per ``with`` instance, when it ends."""
        results: list[Any] = []
        first = -1
        for index in range(total):
            d = self.dispatch((run.name, run.iteration, index))
            results.append(None if d is None else d.result)
            if first < 0 and d is not None and d.status == "failed":
                first = index
        return results, first

    # -- ending -----------------------------------------------------------------------

    def end_task(self, key: TaskKey, status: TaskStatus, result: Any, error: str | None) -> None:
        run = self.update_task(key, status=status, result=result, error=error)
        if status == "cancelled" or self.canceling:
            return  # a cancelled task, or any task of a cancelled workflow: no transitions
        self.transitions(key, run)

    def transitions(self, key: TaskKey, run: TaskRun) -> None:
        """Every ``next`` entry whose ``when`` holds: publish in order, then ``do``.
        A failed task that no entry matched fails the workflow (Orquesta: unhandled).
        The ``retry`` command comes first: while it retries, no entry is followed."""
        spec = self.spec.tasks[run.name]
        matched, failing = False, False
        targets: list[str] = []
        try:
            if self.retry_command(key, run):
                return
            for n, tr in enumerate(spec.next):
                do = [t for t in tr.do if t != RETRIED]
                if tr.do and not do:
                    continue  # only the retry command: not a transition (Orquesta draws no edge for it)
                if tr.when is not None and not self.evaluate(tr.when, self._after(run), key, f"next[{n}].when"):
                    continue
                matched = True
                for name, value in tr.publish:
                    # A fresh scope each time: later entries see earlier ones.
                    self.context[name] = self.evaluate(value, self._after(run), key, f"next[{n}].publish.{name}")
                for target in do:
                    if target == "fail":
                        failing = True
                    elif target not in COMMANDS:  # continue, noop: nothing
                        targets.append(target)
        except Stop:
            return
        if failing:
            self.fail(key, f"task {run.name!r} failed the workflow ('fail' in its transitions)", type="fail")
        elif run.status == "failed" and not matched:
            self.fail(key, run.error or f"task {run.name!r} failed", type="task")
        for target in targets:
            self.arrive(target, key, force=failing)

    def retry_command(self, key: TaskKey, run: TaskRun) -> bool:
        """``do: retry`` as Orquesta reads it: not a transition but the task's retry policy,
        ``{when: <the entry's when, or completed()>, count: 3}`` (the last such entry wins).
        It runs the task again as a new iteration, at most :data:`RETRY_COMMAND_COUNT`
        times in a row, and the task's transitions are followed only after the last
        attempt. Unbounded (as it was: every end re-entered the task), ``do: retry``
        without ``when`` ran a task ``max_iterations`` times where Orquesta runs it 4."""
        entries = [(n, tr) for n, tr in enumerate(self.spec.tasks[run.name].next) if RETRIED in tr.do]
        if not entries or self.stopping or run.arrivals.count(RETRIED) >= RETRY_COMMAND_COUNT:
            return False
        n, tr = entries[-1]
        if tr.when is not None and not self.evaluate(tr.when, self._after(run), key, f"next[{n}].when"):
            return False
        # The marker counts the attempts on the instance itself (no task is named "retry").
        self.enter(run.name, (*run.arrivals, RETRIED))
        return True

    def _after(self, run: TaskRun) -> Any:
        return self.scope(result=run.result, status=run.status)
