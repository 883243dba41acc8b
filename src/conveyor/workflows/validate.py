"""Registration-time checks of a parsed workflow: everything that can be known before it
runs, every problem with its path (all of them, not only the first)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from conveyor.expressions import has_expression, syntax_errors, unknown_functions
from conveyor.workflows.problems import Problem, join
from conveyor.workflows.spec import COMMANDS, TaskSpec, WorkflowSpec


def validate(spec: WorkflowSpec, known_actions: Collection[str]) -> list[Problem]:
    """The problems of ``spec``: unknown action refs (a workflow may run other workflows,
    so its own ref is known only if ``known_actions`` has it), unknown tasks in ``do``,
    no tasks, no start task, unreachable tasks, a ``join`` with one inbound transition,
    expression syntax errors, negative retry counts or delays, a literal concurrency
    below 1, a negative workflow timeout. Empty when there is none."""
    problems: list[Problem] = []
    if not spec.tasks:
        problems.append(Problem("tasks", "a workflow needs at least one task"))
    # The builder (not only YAML) makes specs: check here too, not only in parse.
    if spec.timeout is not None and (isinstance(spec.timeout, bool) or not isinstance(spec.timeout, int | float)):
        problems.append(Problem("timeout", "must be a number of seconds"))
    elif spec.timeout is not None and spec.timeout < 0:
        problems.append(Problem("timeout", "must not be negative"))
    for i, (name, value) in enumerate(spec.vars):
        _expressions(problems, join(join("vars", i), name), value)
    for i, (name, value) in enumerate(spec.output):
        _expressions(problems, join(join("output", i), name), value)
    for i, item in enumerate(spec.input):
        if item.has_default:
            _expressions(problems, join(join("input", i), item.name), item.default)
    for name, task in spec.tasks.items():
        _task(problems, spec, task, join("tasks", name), known_actions)
    _graph(problems, spec)
    return problems


def _task(problems: list[Problem], spec: WorkflowSpec, task: TaskSpec, path: str, known: Collection[str]) -> None:
    if task.action is not None and task.action not in known:
        problems.append(Problem(join(path, "action"), f"unknown action {task.action!r}"))
    for key, value in task.input.items():
        _expressions(problems, join(join(path, "input"), key), value)
    for i, tr in enumerate(task.next):
        at = join(join(path, "next"), i)
        if tr.when is not None:
            _expressions(problems, join(at, "when"), tr.when)
        for j, (name, value) in enumerate(tr.publish):
            _expressions(problems, join(join(join(at, "publish"), j), name), value)
        for target in tr.do:
            if target not in spec.tasks and target not in COMMANDS:
                problems.append(Problem(join(at, "do"), f"unknown task {target!r}"))
    if task.with_items is not None:
        w = task.with_items
        _expressions(problems, join(join(path, "with"), "items"), w.items)
        if isinstance(w.items, str) and not has_expression(w.items):
            problems.append(Problem(join(join(path, "with"), "items"), "must be a list or an expression"))
        if isinstance(w.concurrency, int) and w.concurrency < 1:
            problems.append(Problem(join(join(path, "with"), "concurrency"), "must be at least 1"))
        else:
            _expressions(problems, join(join(path, "with"), "concurrency"), w.concurrency)
    if task.retry is not None:
        r, at = task.retry, join(path, "retry")
        if isinstance(r.count, int) and r.count < 0:
            problems.append(Problem(join(at, "count"), "must not be negative"))
        _expressions(problems, join(at, "count"), r.count)
        if r.when is not None:
            _expressions(problems, join(at, "when"), r.when)
        if r.delay < 0:
            problems.append(Problem(join(at, "delay"), "must not be negative"))
        if r.backoff < 1:
            problems.append(Problem(join(at, "backoff"), "must be at least 1"))
        if r.max_delay is not None and r.max_delay < 0:
            problems.append(Problem(join(at, "max_delay"), "must not be negative"))
    for key, value in (("timeout", task.timeout), ("delay", task.delay)):
        if value is not None and value < 0:
            problems.append(Problem(join(path, key), "must not be negative"))


def _expressions(problems: list[Problem], path: str, value: Any) -> None:
    problems.extend(Problem(path, f"expression syntax error: {error}") for error in syntax_errors(value))
    problems.extend(Problem(path, f"expression {e}") for e in unknown_functions(value))


def _graph(problems: list[Problem], spec: WorkflowSpec) -> None:
    if not spec.tasks:
        return
    starts = spec.starts()
    if not starts:
        problems.append(Problem("tasks", "no task to start with: every task has an inbound transition"))
    reached: set[str] = set()
    pending = list(starts)
    while pending:
        name = pending.pop()
        if name in reached or name not in spec.tasks:
            continue
        reached.add(name)
        pending.extend(t for tr in spec.tasks[name].next for t in tr.do if t not in COMMANDS)
    if starts:
        for name in spec.tasks:
            if name not in reached:
                problems.append(Problem(join("tasks", name), "unreachable: no path leads here from a start task"))
    for name, task in spec.tasks.items():
        inbound = spec.inbound(name)
        if task.join is not None and len(inbound) < 2:
            problems.append(
                Problem(
                    join(join("tasks", name), "join"),
                    f"a join needs two or more inbound transitions; this task has {len(inbound)}",
                )
            )
        elif isinstance(task.join, int) and task.join > len(inbound):
            problems.append(
                Problem(
                    join(join("tasks", name), "join"),
                    f"joins {task.join} inbound transitions but the task has only {len(inbound)}",
                )
            )
