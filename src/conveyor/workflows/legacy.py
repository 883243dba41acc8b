"""Attune's legacy task keys, converted to Orquesta's ``next``.

``on_success: b`` becomes ``next: [{when: <% succeeded() %>, do: [b]}]``, ``on_failure``
becomes ``when: <% failed() %>``, ``on_complete`` a transition with no ``when``. Each
takes a task name, a list of them (or ``"a, b"``), or a mapping ``{do, publish}`` (also
``{next, publish}``/``{tasks, publish}``, as older definitions wrote it), in that
order: success, failure, complete. A task mixing these keys with ``next`` is a problem:
the order of the two would be ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from conveyor.workflows.problems import Problem, join
from conveyor.workflows.shorthand import ShorthandError, pairs, task_names
from conveyor.workflows.spec import Transition

CONDITIONS: Final[dict[str, str | None]] = {
    "on_success": "<% succeeded() %>",
    "on_failure": "<% failed() %>",
    "on_complete": None,
}
KEYS: Final = tuple(CONDITIONS)
_TARGET_KEYS: Final = ("do", "next", "tasks")


def transitions(task: Mapping[Any, Any], path: str, problems: list[Problem]) -> tuple[Transition, ...] | None:
    """The task's legacy keys as transitions, None when it has none (then its ``next``
    applies). Problems are appended to ``problems``."""
    present = [key for key in KEYS if key in task]
    if not present:
        return None
    if "next" in task:
        problems.append(
            Problem(join(path, "next"), f"cannot be mixed with the legacy {', '.join(present)}: use one or the other")
        )
    out: list[Transition] = []
    for key in present:
        transition = _transition(task[key], CONDITIONS[key], join(path, key), problems)
        if transition is not None:
            out.append(transition)
    return tuple(out)


def _transition(value: Any, when: str | None, path: str, problems: list[Problem]) -> Transition | None:
    if isinstance(value, str):
        return Transition(when, (), tuple(task_names(value)))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return Transition(when, (), tuple(v.strip() for v in value))
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in (*_TARGET_KEYS, "publish")]
        for key in unknown:
            problems.append(Problem(join(path, str(key)), "unknown key (expected one of: do, publish)"))
        targets = [k for k in _TARGET_KEYS if k in value]
        if len(targets) > 1:
            problems.append(Problem(path, f"give the tasks once (found {', '.join(targets)})"))
        do: tuple[str, ...] = ()
        if targets:
            target = value[targets[0]]
            if isinstance(target, str):
                do = tuple(task_names(target))
            elif isinstance(target, list) and all(isinstance(v, str) for v in target):
                do = tuple(v.strip() for v in target)
            else:
                problems.append(Problem(join(path, targets[0]), "must be a task name or a list of them"))
        return Transition(when, _publish(value.get("publish"), join(path, "publish"), problems), do)
    problems.append(Problem(path, "must be a task name, a list of them, or {do, publish}"))
    return None


def _publish(value: Any, path: str, problems: list[Problem]) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            return tuple(pairs(value).items())
        except ShorthandError as exc:
            problems.append(Problem(path, str(exc)))
            return ()
    if isinstance(value, Mapping):
        return tuple((str(k), v) for k, v in value.items())
    if isinstance(value, list) and all(isinstance(e, Mapping) and len(e) == 1 for e in value):
        return tuple((str(k), v) for e in value for k, v in e.items())
    problems.append(Problem(path, "must be a list of {name: value} or a mapping"))
    return ()
