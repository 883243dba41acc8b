"""The workflow model: what a definition means once parsed, whatever it was written in.

YAML (Orquesta-style or Attune's legacy ``on_success``/``on_failure``/``on_complete``) and
the Python builder all produce a :class:`WorkflowSpec`; the executor runs only this. It is
stored as JSON (``workflow_definition.definition``) by :meth:`WorkflowSpec.to_json` and read
back with :meth:`WorkflowSpec.from_json`, so a running workflow keeps the version it
started with.

Values that may hold expressions (``when``, ``input`` values, ``publish`` values,
``items``, ``concurrency``, ``output`` values, ``vars`` values, a retry's ``when`` and
``count``) are kept as written: strings containing ``<% ... %>`` (YAQL) or ``{{ ... }}``
(Jinja2) are evaluated at run time by :mod:`conveyor.expressions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# ``do`` may name tasks or one of these commands (Orquesta's engine commands).
COMMANDS: frozenset[str] = frozenset({"continue", "fail", "noop", "retry"})

Join = Literal["all"] | int | None


@dataclass(frozen=True, slots=True)
class Transition:
    """One entry of a task's ``next``: when ``when`` holds after the task ended, publish
    the variables in order, then start the tasks (or run the commands) in ``do``.

    ``when`` None means always. Orquesta's ``succeeded()``/``failed()``/``completed()``
    are expressions like any other; the legacy ``on_success`` becomes
    ``when: <% succeeded() %>``."""

    when: str | None = None
    publish: tuple[tuple[str, Any], ...] = ()
    do: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WithItems:
    """``with: {items, concurrency}``: run the action once per item.

    ``items`` is an expression (or literal list) giving the list; Orquesta's
    ``x in <% ... %>`` form names the item variable ``x`` (``var``), else ``item()``
    returns the item. Several ``a, b in <% zip(...) %>`` names are allowed (``var`` then
    holds them comma-separated, each bound from the item's position). ``concurrency``:
    at most this many items running at once (None: all)."""

    items: Any
    var: str | None = None
    concurrency: Any = None


@dataclass(frozen=True, slots=True)
class RetrySpec:
    """``retry: {when, count, delay, backoff, max_delay}``: run the task's action again
    when it failed (or when ``when`` holds), at most ``count`` more times, waiting
    ``delay`` seconds, multiplied by ``backoff`` after each retry, capped at
    ``max_delay``."""

    count: Any = 0
    when: str | None = None
    delay: float = 0.0
    backoff: float = 1.0
    max_delay: float | None = None


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task. ``action`` None is a task that runs nothing and succeeds at once (a
    pure routing or join point). ``input`` values may hold expressions. ``join``: "all"
    (every inbound transition arrived), N (the N-th arrival), None (each arrival starts
    the task: Orquesta's default)."""

    name: str
    action: str | None = None
    input: dict[str, Any] = field(default_factory=dict)
    next: tuple[Transition, ...] = ()
    with_items: WithItems | None = None
    join: Join = None
    retry: RetrySpec | None = None
    timeout: float | None = None
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class InputSpec:
    """A workflow input: a name and, if ``has_default``, its default (an expression is
    allowed and sees the inputs given)."""

    name: str
    has_default: bool = False
    default: Any = None


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    ref: str
    version: str = "1.0"
    description: str = ""
    input: tuple[InputSpec, ...] = ()
    # JSON Schema of the parameters: the one given (``parameters:``), else derived from
    # ``input`` (every name a property; those without a default required).
    parameters_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    vars: tuple[tuple[str, Any], ...] = ()
    tasks: dict[str, TaskSpec] = field(default_factory=dict)
    output: tuple[tuple[str, Any], ...] = ()
    # Cycles are allowed; a task entered more than this many times fails the workflow.
    max_iterations: int = 100
    # Seconds the whole workflow may run (None: no limit). Stored as the definition's
    # top-level "timeout", which start_workflows (migration 0013) turns into the
    # workflow_execution's deadline.
    timeout: float | None = None

    def starts(self) -> list[str]:
        """Tasks with no inbound transition, in definition order: they start first."""
        targets = {t for task in self.tasks.values() for tr in task.next for t in tr.do if t not in COMMANDS}
        return [name for name in self.tasks if name not in targets]

    def inbound(self, name: str) -> list[str]:
        """The tasks with a transition to ``name`` (with repeats: one per transition)."""
        return [task.name for task in self.tasks.values() for tr in task.next if name in tr.do]

    def to_json(self) -> dict[str, Any]:
        """The stored form: plain JSON (pairs as ``[name, value]`` lists, order kept)."""
        return {
            "ref": self.ref,
            "version": self.version,
            "description": self.description,
            "input": [[i.name, i.has_default, i.default] for i in self.input],
            "parameters_schema": self.parameters_schema,
            "vars": [list(pair) for pair in self.vars],
            "tasks": [_task_json(t) for t in self.tasks.values()],
            "output": [list(pair) for pair in self.output],
            "max_iterations": self.max_iterations,
            "timeout": self.timeout,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkflowSpec:
        return cls(
            ref=data["ref"],
            version=data.get("version", "1.0"),
            description=data.get("description", ""),
            input=tuple(InputSpec(n, bool(h), d) for n, h, d in data.get("input", [])),
            parameters_schema=data.get("parameters_schema", {"type": "object"}),
            vars=tuple((n, v) for n, v in data.get("vars", [])),
            tasks={t["name"]: _task_from_json(t) for t in data.get("tasks", [])},
            output=tuple((n, v) for n, v in data.get("output", [])),
            max_iterations=data.get("max_iterations", 100),
            timeout=data.get("timeout"),
        )


def _task_json(task: TaskSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": task.name,
        "action": task.action,
        "input": task.input,
        "next": [{"when": tr.when, "publish": [list(p) for p in tr.publish], "do": list(tr.do)} for tr in task.next],
        "join": task.join,
        "timeout": task.timeout,
        "delay": task.delay,
    }
    if task.with_items is not None:
        w = task.with_items
        out["with"] = {"items": w.items, "var": w.var, "concurrency": w.concurrency}
    if task.retry is not None:
        r = task.retry
        out["retry"] = {
            "count": r.count,
            "when": r.when,
            "delay": r.delay,
            "backoff": r.backoff,
            "max_delay": r.max_delay,
        }
    return out


def _task_from_json(data: dict[str, Any]) -> TaskSpec:
    w, r = data.get("with"), data.get("retry")
    return TaskSpec(
        name=data["name"],
        action=data.get("action"),
        input=data.get("input") or {},
        next=tuple(
            Transition(tr.get("when"), tuple((n, v) for n, v in tr.get("publish", [])), tuple(tr.get("do", [])))
            for tr in data.get("next", [])
        ),
        with_items=WithItems(w["items"], w.get("var"), w.get("concurrency")) if w else None,
        join=data.get("join"),
        retry=RetrySpec(
            r.get("count", 0), r.get("when"), r.get("delay", 0.0), r.get("backoff", 1.0), r.get("max_delay")
        )
        if r
        else None,
        timeout=data.get("timeout"),
        delay=data.get("delay"),
    )
