"""Registering actions in code.

Python actions are callables (sync ones run in a thread pool, async ones on the
worker's loop). Subprocess actions are data: their definition is stored in the
``action`` table, so any worker offering their runtime can run them.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

JSONSchema = dict[str, Any]
_REF = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+$")
_INT_MAX = 2**31 - 1  # admission_policy.concurrency is a PostgreSQL integer
_NAME_MAX = 255
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}


@dataclass(frozen=True)
class ActionDefinition:
    ref: str
    runner_type: Literal["python", "subprocess"]
    runtime: str
    parameters_schema: JSONSchema
    description: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    func: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    @property
    def pack(self) -> str:
        return self.ref.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.ref.split(".", 1)[1]

    def row(self) -> dict[str, Any]:
        """The ``action`` table row for this definition."""
        return {
            "ref": self.ref,
            "pack": self.pack,
            "name": self.name,
            "description": self.description,
            "runner_type": self.runner_type,
            "runtime": self.runtime,
            "parameters_schema": self.parameters_schema,
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """A concurrency limit (``policy=`` of an action, or set by an operator): at most
    ``concurrency`` executions at once, one such limit per distinct combination of the
    values of ``parameters``; beyond it, ``enqueue`` waits in request order and ``cancel``
    refuses at once. Invalid values raise ValueError here, not later in the database
    (where they would make a worker's registration fail)."""

    concurrency: int
    parameters: tuple[str, ...] = ()
    method: Literal["enqueue", "cancel"] = "enqueue"

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise ValueError(f"concurrency must be a whole number, not {self.concurrency!r}")
        if not 1 <= self.concurrency <= _INT_MAX:
            raise ValueError(f"concurrency must be between 1 and {_INT_MAX}, not {self.concurrency}")
        if not isinstance(self.parameters, list | tuple):  # ("host") instead of ("host",) is a str
            raise ValueError(f"parameters must be a list of parameter names, not {self.parameters!r}")
        names = tuple(self.parameters)
        for name in names:
            if not _storable_name(name):
                raise ValueError(
                    f"parameter names must be non-empty strings (at most {_NAME_MAX} characters): {name!r}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"parameter names are repeated: {list(names)}")
        if self.method not in ("enqueue", "cancel"):
            raise ValueError(f"method must be 'enqueue' or 'cancel', not {self.method!r}")
        object.__setattr__(self, "parameters", names)  # a list given is kept as a tuple (hashable)

    @classmethod
    def of(cls, spec: AdmissionPolicy | Mapping[str, Any]) -> AdmissionPolicy:
        if isinstance(spec, AdmissionPolicy):
            return spec
        if not isinstance(spec, Mapping):
            raise ValueError(f"policy must be an AdmissionPolicy or a mapping, not {type(spec).__name__}")
        unknown = set(spec) - {"concurrency", "parameters", "method"}
        if unknown:
            raise ValueError(f"unknown policy settings: {sorted(unknown)} (known: concurrency, parameters, method)")
        if "concurrency" not in spec:
            raise ValueError("policy needs concurrency")
        return cls(spec["concurrency"], spec.get("parameters", ()), spec.get("method", "enqueue"))

    def to_json(self) -> dict[str, Any]:
        """As stored in ``action.metadata["policy"]`` (read by the admission trigger)."""
        return {"concurrency": self.concurrency, "parameters": list(self.parameters), "method": self.method}


def _storable_name(name: object) -> bool:
    """A parameter name PostgreSQL can store in text[] (no NUL, no lone surrogate)."""
    if not isinstance(name, str) or not name or "\x00" in name or len(name) > _NAME_MAX:
        return False
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def schema_from_signature(func: Callable[..., Any]) -> JSONSchema:
    """A JSON Schema from a function's annotated keyword parameters: parameters without
    a default are required, unknown parameters are refused."""
    hints = typing.get_type_hints(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        properties[name] = _json_type(hints.get(name, Any))
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        names = [_json_type(arg).get("type") for arg in typing.get_args(hint)]
        flat = [n for n in names if isinstance(n, str)]
        return {"type": flat} if len(flat) == len(names) else {}
    if hint is type(None):
        return {"type": "null"}
    base = origin or hint
    name = _JSON_TYPES.get(base)
    return {"type": name} if name else {}


def policy_metadata(
    *,
    timeout: float | None = None,
    scheduled_timeout: float | None = None,
    retry: Mapping[str, Any] | None = None,
    on_worker_lost: Literal["retry", "abandon"] | None = None,
    worker_lost_max_attempts: int | None = None,
    policy: AdmissionPolicy | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Per-action overrides of the global defaults, as stored in ``action.metadata``."""
    out: dict[str, Any] = {}
    if policy is not None:
        out["policy"] = AdmissionPolicy.of(policy).to_json()
    if timeout is not None:
        out["timeout"] = timeout
    if scheduled_timeout is not None:
        out["scheduled_timeout"] = scheduled_timeout
    if retry:
        unknown = set(retry) - {"max_attempts", "backoff_base", "backoff_max", "retry_on"}
        if unknown:
            raise ValueError(f"unknown retry settings: {sorted(unknown)}")
        out["retry"] = dict(retry)
    if on_worker_lost is not None:
        if on_worker_lost not in ("retry", "abandon"):
            raise ValueError("on_worker_lost must be 'retry' or 'abandon'")
        out["on_worker_lost"] = on_worker_lost
    if worker_lost_max_attempts is not None:
        out["worker_lost_max_attempts"] = worker_lost_max_attempts
    return out


class ActionRegistry:
    def __init__(self) -> None:
        self._actions: dict[str, ActionDefinition] = {}

    def add(self, definition: ActionDefinition) -> ActionDefinition:
        if not _REF.fullmatch(definition.ref):
            raise ValueError(f"action ref {definition.ref!r} must look like pack.name")
        jsonschema.Draft202012Validator.check_schema(definition.parameters_schema)
        existing = self._actions.get(definition.ref)
        if existing is not None and existing != definition:
            raise ValueError(f"action {definition.ref!r} is registered twice with different definitions")
        self._actions[definition.ref] = definition
        return definition

    def action(
        self,
        ref: str,
        *,
        parameters: JSONSchema | None = None,
        description: str | None = None,
        timeout: float | None = None,
        scheduled_timeout: float | None = None,
        retry: Mapping[str, Any] | None = None,
        on_worker_lost: Literal["retry", "abandon"] | None = None,
        worker_lost_max_attempts: int | None = None,
        policy: AdmissionPolicy | Mapping[str, Any] | None = None,
        isolation: Literal["thread", "process"] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a Python callable as action ``ref``. ``parameters`` is a JSON Schema;
        without one it is derived from the signature. The policy arguments override the
        configured defaults for this action: ``timeout`` (execution), ``scheduled_timeout``
        (schedule-to-start), ``retry`` (max_attempts, backoff_base, backoff_max, retry_on),
        ``on_worker_lost`` and ``worker_lost_max_attempts``. ``policy`` is its admission
        policy (an :class:`AdmissionPolicy` or a mapping with the same keys): a concurrency
        limit an operator's ``conveyor policies set`` overrides. ``isolation`` says where it
        runs, overriding the worker's ``worker.isolation``: ``"thread"`` (in the worker
        process: a thread for a sync function, the worker's loop for an async one) or
        ``"process"`` (a child process the worker kills on cancel, timeout or lost standing,
        and that stops itself when its worker is frozen; the function must then be
        importable by its module and name)."""
        admission = AdmissionPolicy.of(policy) if policy is not None else None  # refused now, not at registration
        if isolation not in (None, "thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', not {isolation!r}")

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            metadata: dict[str, Any] = {
                "async": inspect.iscoroutinefunction(func),
                "entry_point": f"{func.__module__}:{func.__qualname__}",
            }
            metadata.update(
                policy_metadata(
                    timeout=timeout,
                    scheduled_timeout=scheduled_timeout,
                    retry=retry,
                    on_worker_lost=on_worker_lost,
                    worker_lost_max_attempts=worker_lost_max_attempts,
                    policy=admission,
                )
            )
            if isolation is not None:
                if isolation == "process" and ("<locals>" in func.__qualname__ or func.__module__ == "__main__"):
                    raise ValueError(
                        f"action {ref!r}: isolation='process' needs a function importable by name "
                        "(defined at the top level of a module other than __main__)"
                    )
                metadata["isolation"] = isolation
            self.add(
                ActionDefinition(
                    ref=ref,
                    runner_type="python",
                    runtime="python",
                    parameters_schema=parameters if parameters is not None else schema_from_signature(func),
                    description=description if description is not None else (inspect.getdoc(func) or ""),
                    metadata=metadata,
                    func=func,
                )
            )
            return func

        return register

    def subprocess_action(
        self,
        ref: str,
        *,
        argv: list[str] | None = None,
        shell: bool = False,
        command_parameter: str | None = None,
        parameters: JSONSchema | None = None,
        output: Literal["text", "json"] = "text",
        stdin: Literal["json", "none"] = "json",
        description: str = "",
        timeout: float | None = None,
        scheduled_timeout: float | None = None,
        retry: Mapping[str, Any] | None = None,
        on_worker_lost: Literal["retry", "abandon"] | None = None,
        worker_lost_max_attempts: int | None = None,
        policy: AdmissionPolicy | Mapping[str, Any] | None = None,
    ) -> ActionDefinition:
        """Register a command. ``argv`` runs without a shell; ``shell=True`` runs the string in
        parameter ``command_parameter`` with ``/bin/sh -c``, and only when the action says so.
        The policy arguments are those of :meth:`action`."""
        if shell == (argv is not None):
            raise ValueError("give either argv or shell=True with command_parameter")
        if shell and not command_parameter:
            raise ValueError("shell=True needs command_parameter")
        metadata: dict[str, Any] = {
            "argv": argv,
            "shell": shell,
            "command_parameter": command_parameter,
            "output": output,
            "stdin": stdin,
        }
        metadata.update(
            policy_metadata(
                timeout=timeout,
                scheduled_timeout=scheduled_timeout,
                retry=retry,
                on_worker_lost=on_worker_lost,
                worker_lost_max_attempts=worker_lost_max_attempts,
                policy=policy,
            )
        )
        return self.add(
            ActionDefinition(
                ref=ref,
                runner_type="subprocess",
                runtime="shell",
                parameters_schema=parameters or {"type": "object"},
                description=description,
                metadata=metadata,
            )
        )

    def get(self, ref: str) -> ActionDefinition | None:
        return self._actions.get(ref)

    def __iter__(self) -> Iterator[ActionDefinition]:
        return iter(sorted(self._actions.values(), key=lambda d: d.ref))

    def __len__(self) -> int:
        return len(self._actions)


# The registry user modules add to with the module-level decorators.
default_registry = ActionRegistry()
action = default_registry.action
subprocess_action = default_registry.subprocess_action
