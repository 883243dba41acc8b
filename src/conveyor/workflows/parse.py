"""Reading a YAML workflow (Orquesta's language, plus Attune's legacy task keys) into a
:class:`~conveyor.workflows.spec.WorkflowSpec`.

Every problem found is collected with its path (``tasks.deploy.next[0].do``) and raised
together as one :class:`WorkflowError`. This checks the shape of the definition only;
:func:`conveyor.workflows.validate.validate` checks what needs the whole picture
(references, reachability, expression syntax).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import jsonschema
import yaml

from conveyor.domain.documents import DEFAULT_LIMITS, DocumentError, Limits, load_yaml
from conveyor.workflows import legacy
from conveyor.workflows.problems import Problem, WorkflowError, join
from conveyor.workflows.shorthand import ShorthandError, pairs, split_action, task_names
from conveyor.workflows.spec import COMMANDS, InputSpec, Join, RetrySpec, TaskSpec, Transition, WithItems, WorkflowSpec

__all__ = ["Problem", "WorkflowError", "load_workflow", "parse_workflow"]

REF: Final = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+$")
_NAME: Final = re.compile(r"^[A-Za-z_][\w-]*$")
# ``x in <% ... %>`` / ``x, y in <% zip(...) %>``: Orquesta's named items.
_ITEMS_IN: Final = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+in\s+(\S.*)$", re.DOTALL)

WORKFLOW_KEYS: Final = ("ref", "version", "description", "input", "parameters", "vars", "tasks", "output", "timeout")
TASK_KEYS: Final = ("action", "input", "next", "with", "join", "retry", "timeout", "delay", *legacy.KEYS)
NEXT_KEYS: Final = ("when", "publish", "do")
WITH_KEYS: Final = ("items", "concurrency")
RETRY_KEYS: Final = ("when", "count", "delay", "backoff", "max_delay")


def parse_workflow(text: str, ref: str | None = None, limits: Limits = DEFAULT_LIMITS) -> WorkflowSpec:
    """The workflow in YAML ``text``; ``ref`` supplies or overrides its ``ref:``.

    Raises :class:`WorkflowError` listing every problem found; a text past ``limits``
    (aliases, depth, size) or naming a key twice is refused before it is expanded."""
    try:
        data = load_yaml(text, limits)
    except DocumentError as exc:
        raise WorkflowError([Problem("", str(exc))]) from None
    except yaml.YAMLError as exc:
        raise WorkflowError([Problem("", _yaml_message(exc))]) from None
    return load_workflow(data, ref)


def _yaml_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"YAML syntax error: {problem}"
    message = f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    # libyaml places an unclosed `[` at the end of the text, PyYAML's own parser at the last
    # token: where the construct that is not closed starts says more than either.
    context, where = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and where is not None:
        message += f" ({context} at line {where.line + 1}, column {where.column + 1})"
    return message


def load_workflow(data: Any, ref: str | None = None) -> WorkflowSpec:
    """The workflow in already-decoded ``data`` (a YAML or JSON document)."""
    return _Reader().workflow(data, ref)


class _Reader:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def keys(self, data: Mapping[Any, Any], path: str, allowed: tuple[str, ...]) -> None:
        for key in data:
            if key not in allowed:
                self.problem(join(path, str(key)), f"unknown key (expected one of: {', '.join(allowed)})")

    def mapping(self, data: Any, path: str, what: str) -> Mapping[Any, Any] | None:
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            self.problem(path, f"{what} must be a mapping, not {_kind(data)}")
            return None
        return data

    # -- the workflow ----------------------------------------------------------------

    def workflow(self, data: Any, ref: str | None) -> WorkflowSpec:
        if not isinstance(data, Mapping):
            raise WorkflowError([Problem("", f"a workflow must be a mapping, not {_kind(data)}")])
        self.keys(data, "", WORKFLOW_KEYS)
        ref = self.ref(data, ref)
        inputs = self.inputs(data.get("input"))
        schema = self.parameters(data.get("parameters"), inputs)
        tasks = self.tasks(data.get("tasks"))
        spec = WorkflowSpec(
            ref=ref,
            version=str(data.get("version", "1.0")),
            description=self.text(data.get("description"), "description"),
            input=inputs,
            parameters_schema=schema,
            vars=self.assignments(data.get("vars"), "vars"),
            tasks=tasks,
            output=self.assignments(data.get("output"), "output"),
            timeout=self.seconds(data.get("timeout"), "timeout"),
        )
        if self.problems:
            raise WorkflowError(self.problems)
        return spec

    def ref(self, data: Mapping[Any, Any], given: str | None) -> str:
        written = data.get("ref")
        if written is not None and not isinstance(written, str):
            self.problem("ref", f"must be text, not {_kind(written)}")
            written = None
        ref = given or written
        if not ref:
            self.problem("ref", "no ref: the file has no `ref:` and none was given (--ref)")
            return ""
        if not REF.fullmatch(ref):
            self.problem("ref", f"{ref!r} is not a ref (pack.name)")
        return ref

    def text(self, value: Any, path: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            self.problem(path, f"must be text, not {_kind(value)}")
            return ""
        return value

    def inputs(self, data: Any) -> tuple[InputSpec, ...]:
        out: list[InputSpec] = []
        if data is None:
            return ()
        if not isinstance(data, list):
            self.problem("input", "must be a list of names or {name: default}")
            return ()
        for i, entry in enumerate(data):
            path = join("input", i)
            if isinstance(entry, str):
                name, spec = entry, InputSpec(entry)
            elif isinstance(entry, Mapping) and len(entry) == 1:
                name, default = next(iter(entry.items()))
                spec = InputSpec(str(name), True, default)
            else:
                self.problem(path, "must be a name or {name: default}")
                continue
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                self.problem(path, f"{name!r} is not a valid input name")
            elif any(existing.name == name for existing in out):
                self.problem(path, f"input {name!r} is declared twice")
            out.append(spec)
        return tuple(out)

    def parameters(self, data: Any, inputs: tuple[InputSpec, ...]) -> dict[str, Any]:
        if data is None:
            return {
                "type": "object",
                "properties": {i.name: {} for i in inputs},
                "required": [i.name for i in inputs if not i.has_default],
                "additionalProperties": False,
            }
        if not isinstance(data, Mapping):
            self.problem("parameters", "must be a JSON Schema (a mapping)")
            return {"type": "object"}
        try:
            jsonschema.validators.validator_for(data).check_schema(dict(data))
        except jsonschema.SchemaError as exc:
            where = ".".join(str(p) for p in exc.absolute_path)
            path = join("parameters", where) if where else "parameters"
            self.problem(path, f"not a valid JSON Schema: {exc.message}")
        return dict(data)

    def assignments(self, data: Any, path: str) -> tuple[tuple[str, Any], ...]:
        """Orquesta's ``- name: value`` lists (a plain mapping is accepted too)."""
        if data is None:
            return ()
        if isinstance(data, str):
            try:
                return tuple(pairs(data).items())
            except ShorthandError as exc:
                self.problem(path, str(exc))
                return ()
        if isinstance(data, Mapping):
            entries: list[Any] = [{k: v} for k, v in data.items()]
        elif isinstance(data, list):
            entries = data
        else:
            self.problem(path, "must be a list of {name: value}")
            return ()
        out: list[tuple[str, Any]] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or len(entry) != 1 or not isinstance(next(iter(entry)), str):
                self.problem(join(path, i), "must be one {name: value}")
                continue
            out.append(next(iter(entry.items())))
        return tuple(out)

    # -- tasks -----------------------------------------------------------------------

    def tasks(self, data: Any) -> dict[str, TaskSpec]:
        tasks = self.mapping(data, "tasks", "tasks")
        out: dict[str, TaskSpec] = {}
        for name, body in (tasks or {}).items():
            path = join("tasks", str(name))
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                self.problem(path, f"{name!r} is not a valid task name")
                continue
            if name in COMMANDS:
                self.problem(path, f"{name!r} is a command of `do`; a task cannot have that name")
                continue
            task = self.task(name, body, path)
            if task is not None:
                out[name] = task
        return out

    def task(self, name: str, data: Any, path: str) -> TaskSpec | None:
        body = self.mapping(data, path, "a task")
        if body is None:
            return None
        self.keys(body, path, TASK_KEYS)
        action, inline = self.action(body.get("action"), join(path, "action"))
        given = self.mapping(body.get("input"), join(path, "input"), "input")
        for key in set(inline) & set(given or {}):
            self.problem(join(path, f"input.{key}"), "given both inline in `action` and in `input`")
        transitions = legacy.transitions(body, path, self.problems)
        if transitions is None:
            transitions = self.transitions(body.get("next"), join(path, "next"))
        return TaskSpec(
            name=name,
            action=action,
            input={**inline, **{str(k): v for k, v in (given or {}).items()}},
            next=transitions,
            with_items=self.with_items(body.get("with"), join(path, "with")),
            join=self.join(body.get("join"), join(path, "join")),
            retry=self.retry(body.get("retry"), join(path, "retry")),
            timeout=self.seconds(body.get("timeout"), join(path, "timeout")),
            delay=self.seconds(body.get("delay"), join(path, "delay")),
        )

    def action(self, value: Any, path: str) -> tuple[str | None, dict[str, Any]]:
        if value is None:
            return None, {}
        if not isinstance(value, str) or not value.strip():
            self.problem(path, "must be an action ref, optionally followed by key=value inputs")
            return None, {}
        try:
            ref, inline = split_action(value)
        except ShorthandError as exc:
            self.problem(path, str(exc))
            return value.split()[0], {}
        if not REF.fullmatch(ref):
            self.problem(path, f"{ref!r} is not an action ref (pack.name)")
        return ref, inline

    def transitions(self, data: Any, path: str) -> tuple[Transition, ...]:
        if data is None:
            return ()
        if not isinstance(data, list):
            self.problem(path, "must be a list of {when, publish, do}")
            return ()
        out: list[Transition] = []
        for i, entry in enumerate(data):
            at = join(path, i)
            body = self.mapping(entry, at, "a transition")
            if body is None:
                continue
            self.keys(body, at, NEXT_KEYS)
            when = body.get("when")
            if when is not None and not isinstance(when, str):
                self.problem(join(at, "when"), "must be an expression (text)")
                when = None
            publish = self.assignments(body.get("publish"), join(at, "publish"))
            out.append(Transition(when, publish, self.do(body.get("do"), join(at, "do"))))
        return tuple(out)

    def do(self, value: Any, path: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(task_names(value))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(v.strip() for v in value)
        self.problem(path, "must be a task name, a list of them, or 'a, b'")
        return ()

    def with_items(self, value: Any, path: str) -> WithItems | None:
        if value is None:
            return None
        if isinstance(value, str | list):
            items, concurrency = value, None
        elif isinstance(value, Mapping):
            self.keys(value, path, WITH_KEYS)
            if "items" not in value:
                self.problem(join(path, "items"), "missing: the list (or expression) to run the action over")
                return None
            items, concurrency = value["items"], value.get("concurrency")
            if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int | str)):
                self.problem(join(path, "concurrency"), "must be a number or an expression")
        else:
            self.problem(path, "must be an expression, `x in <% ... %>`, or {items, concurrency}")
            return None
        var = None
        if isinstance(items, str):
            m = _ITEMS_IN.match(items)
            if m and not m.group(1).startswith(("<%", "{{")):
                var = ", ".join(n.strip() for n in m.group(1).split(","))
                items = m.group(2).strip()
        elif not isinstance(items, list):
            where = join(path, "items") if isinstance(value, Mapping) else path
            self.problem(where, "must be a list or an expression")
        return WithItems(items, var, concurrency)

    def join(self, value: Any, path: str) -> Join:
        if value is None or value == "all":
            return value  # type: ignore[no-any-return]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        self.problem(path, "must be `all` or a number of inbound transitions (1 or more)")
        return None

    def retry(self, value: Any, path: str) -> RetrySpec | None:
        body = self.mapping(value, path, "retry") if value is not None else None
        if body is None:
            return None
        self.keys(body, path, RETRY_KEYS)
        count = body.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int | str):
            self.problem(join(path, "count"), "must be a number or an expression")
            count = 0
        when = body.get("when")
        if when is not None and not isinstance(when, str):
            self.problem(join(path, "when"), "must be an expression (text)")
            when = None
        return RetrySpec(
            count=count,
            when=when,
            delay=self.number(body.get("delay", 0.0), join(path, "delay")) or 0.0,
            backoff=self.number(body.get("backoff", 1.0), join(path, "backoff")) or 1.0,
            max_delay=self.number(body.get("max_delay"), join(path, "max_delay")),
        )

    def number(self, value: Any, path: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(path, f"must be a number, not {_kind(value)}")
            return None
        return float(value)

    def seconds(self, value: Any, path: str) -> float | None:
        number = self.number(value, path)
        if number is not None and number < 0:
            self.problem(path, "must not be negative")
        return number


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean"}.get(type(value), type(value).__name__)
