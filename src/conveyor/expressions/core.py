"""What both expression engines share: the scope, the error, the bounds, the functions.

Private to :mod:`conveyor.expressions` (import from there). The functions read the
evaluation in progress from a context variable rather than from their arguments, so each
engine registers them once (not once per evaluation: a ``with`` of 10,000 items evaluates
its input 10,000 times).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import posixpath
import time
from collections.abc import Mapping, Sequence, Set
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Final

import yaml

from conveyor.domain import documents
from conveyor.domain.documents import DocumentError, load_json, load_yaml


class _Missing:
    """The type of :data:`MISSING`: no item (the task has no ``with``)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()


@dataclass(frozen=True, slots=True)
class Scope:
    """What an expression sees.

    ``ctx``: the workflow's variables (inputs, vars, published values). ``result`` and
    ``status`` ('succeeded' | 'failed' | None): the task that just ended, for ``next``
    and ``retry``. ``item``/``index``: the current ``with`` item (MISSING outside one).
    ``item_vars``: the names of Orquesta's ``x in <% ... %>`` / ``x, y in <% ... %>``
    form (see :func:`item_vars`): then ``item()`` returns ``{x: ...}``, ``item(x)`` the value,
    and ``ctx(x)`` / ``$.x`` see it too. ``tasks``: ``{"status", "result"}`` per task name,
    for ``task(name)``."""

    ctx: Mapping[str, Any]
    result: Any = None
    status: str | None = None
    item: Any = MISSING
    index: int | None = None
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    item_vars: tuple[str, ...] = ()
    # Rules (conveyor.rules.render): Jinja sees ctx's variables by name too, as StackStorm
    # rule templates write them (``{{ trigger.body.x }}``); workflows keep Orquesta's ctx().
    jinja_names: bool = False


def item_vars(var: str | None) -> tuple[str, ...]:
    """The names in a :class:`~conveyor.workflows.spec.WithItems` ``var`` ("x" or "x, y")."""
    return tuple(v.strip() for v in var.split(",") if v.strip()) if var else ()


class ExpressionError(Exception):
    """An expression that cannot be evaluated (or parsed): which one, and why."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(expression, message)
        self.expression = expression
        self.message = message

    def __str__(self) -> str:
        return f"expression {self.expression!r}: {self.message}"


class Refused(Exception):
    """Raised inside an engine when a bound or the sandbox refuses something; the caller
    turns it into an :class:`ExpressionError` naming the expression."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of one :func:`evaluate` call (the whole value, every expression in it).

    ``seconds``: wall time; ``max_bytes``: the JSON-encoded size of any result (and of any
    string or collection built on the way, where the engine lets us see it). Five seconds:
    YAQL spends about 0.1 ms per lambda call, so a ``select`` over 10,000 items takes one."""

    seconds: float = 5.0
    max_bytes: int = 1 << 20
    # ``from_json_string``, ``json``, ``from_yaml_string``: the bounds of every document a
    # user sends (settings ``documents.*``; the executor passes its own).
    documents: documents.Limits = documents.DEFAULT_LIMITS


DEFAULT_LIMITS: Final = Limits()


@dataclass(slots=True)
class Evaluation:
    """The evaluation in progress (one per :func:`evaluate` call)."""

    scope: Scope
    limits: Limits
    deadline: float
    ctx_view: Mapping[str, Any]

    def check(self) -> None:
        # Python's clock is right here: this bounds CPU spent, it decides nothing durable.
        if time.monotonic() > self.deadline:
            raise Refused(f"took longer than {self.limits.seconds:g} s")


CURRENT: ContextVar[Evaluation | None] = ContextVar("conveyor_expression_evaluation", default=None)


def current() -> Evaluation:
    ev = CURRENT.get()
    if ev is None:  # only if a function is called outside evaluate(): a programming error
        raise Refused("workflow functions are only available inside evaluate()")
    ev.check()
    return ev


def begin(scope: Scope, limits: Limits) -> Evaluation:
    view: Mapping[str, Any] = scope.ctx
    if scope.item_vars and scope.item is not MISSING:
        view = {**scope.ctx, **bound_item(scope)}
    return Evaluation(scope, limits, time.monotonic() + limits.seconds, view)


def bound_item(scope: Scope) -> dict[str, Any]:
    """``{x: item}`` for one name; ``{x: item[0], y: item[1]}`` for several (Orquesta)."""
    names = scope.item_vars
    if len(names) == 1:
        return {names[0]: scope.item}
    if not isinstance(scope.item, Sequence) or isinstance(scope.item, str) or len(scope.item) != len(names):
        raise Refused(f"item {scope.item!r} cannot be unpacked into {', '.join(names)}")
    return dict(zip(names, scope.item, strict=True))


# ---------------------------------------------------------------------------
# The workflow functions (Orquesta's), shared by YAQL and Jinja.
# ---------------------------------------------------------------------------


def fn_ctx(name: str | None = None) -> Any:
    ev = current()
    if name is None:
        return dict(ev.ctx_view)
    if name not in ev.ctx_view:
        raise Refused(f"ctx has no variable {name!r}")
    return ev.ctx_view[name]


def fn_result() -> Any:
    return current().scope.result


def fn_succeeded() -> bool:
    return current().scope.status == "succeeded"


def fn_failed() -> bool:
    return current().scope.status == "failed"


def fn_completed() -> bool:
    return current().scope.status in ("succeeded", "failed")


def fn_item(name: str | None = None) -> Any:
    scope = current().scope
    if scope.item is MISSING:
        raise Refused("item() is only available in a task with `with` items")
    if not scope.item_vars:
        if name is None:
            return scope.item
        if isinstance(scope.item, Mapping) and name in scope.item:
            return scope.item[name]
        raise Refused(f"the item has no {name!r}")
    bound = bound_item(scope)
    if name is None:
        return bound
    if name not in bound:
        raise Refused(f"the item has no {name!r} (its names: {', '.join(scope.item_vars)})")
    return bound[name]


def fn_task(name: str) -> dict[str, Any]:
    tasks = current().scope.tasks
    if name not in tasks:
        raise Refused(f"no task {name!r} has run")
    return {"status": tasks[name].get("status"), "result": tasks[name].get("result")}


def fn_task_status(name: str) -> Any:
    return fn_task(name)["status"]


def fn_to_json_string(value: Any) -> str:
    current()
    return json.dumps(plain(value), sort_keys=True)


def _json_text(text: str) -> Any:
    """JSON from a value an expression holds (an action's output, ...): the bounds and the
    strictness of every document a user sends (conveyor.domain.documents)."""
    try:
        return load_json(text, current().limits.documents)
    except DocumentError as exc:
        raise Refused(str(exc)) from None


def fn_from_json_string(text: str) -> Any:
    current()
    return _json_text(text)


# The largest zip() result (items times lists): its inputs are bounded already, but padding
# (zip_longest) multiplies the longest by the number of lists.
MAX_ZIP_CELLS: Final = 1_000_000


def fn_zip(*lists: Any, pad: Any = None) -> list[Any]:
    """Orquesta's ``zip``: one list of tuples, padded to the longest with ``pad``; a single
    list is returned as it is; None counts as an empty list."""
    current()
    seqs = [[] if arg is None else list(arg) for arg in lists]
    if len(seqs) == 1:
        return seqs[0]
    longest = max((len(seq) for seq in seqs), default=0)
    if longest * len(seqs) > MAX_ZIP_CELLS:
        raise Refused(f"zip of {len(seqs)} lists of up to {longest} items is too large")
    return [list(row) for row in itertools.zip_longest(*seqs, fillvalue=pad)]


def fn_json(text: Any) -> Any:
    """Orquesta's ``json``: a mapping as it is, a string decoded as JSON."""
    current()
    if isinstance(text, Mapping):
        return text
    if not isinstance(text, str):
        raise Refused(f"json() takes text or a mapping, not {type(text).__name__}")
    return _json_text(text)


def fn_from_yaml_string(text: str) -> Any:
    """Safe YAML (no Python objects) within the ``documents`` bounds, and without aliases:
    a value an expression reads is data, and ``*a`` is how a few bytes become a large one."""
    limits = current().limits
    if len(text) > limits.max_bytes:
        raise Refused("the YAML text is larger than the size limit")
    try:
        return load_yaml(text, replace(limits.documents, max_aliases=0))
    except DocumentError as exc:
        if exc.setting == "max_aliases":
            raise Refused("YAML aliases (*name) are not allowed in expressions") from None
        raise Refused(str(exc)) from None


def fn_to_yaml_string(value: Any) -> str:
    current()
    return str(yaml.safe_dump(plain(value), sort_keys=False, allow_unicode=True))


def fn_json_escape(value: Any) -> str:
    """st2's ``json_escape``: the value as JSON without its enclosing quotes (text escaped
    to sit inside a JSON string literal)."""
    current()
    return json.dumps(plain(value)).strip('"')


def fn_use_none(value: Any) -> Any:
    """st2's ``use_none``: there it swaps None for a marker that survives its text
    rendering; here values keep their type, so the value as it is."""
    current()
    return value


def fn_basename(path: str) -> str:
    current()
    return posixpath.basename(path)


def fn_dirname(path: str) -> str:
    current()
    return posixpath.dirname(path)


FUNCTIONS: Final[dict[str, Any]] = {
    "ctx": fn_ctx,
    "result": fn_result,
    "succeeded": fn_succeeded,
    "failed": fn_failed,
    "completed": fn_completed,
    "item": fn_item,
    "task": fn_task,
    "task_status": fn_task_status,
    "to_json_string": fn_to_json_string,
    "from_json_string": fn_from_json_string,
    # Orquesta's common functions, and StackStorm's data and path functions.
    "zip": fn_zip,
    "json": fn_json,
    "json_parse": fn_from_json_string,
    "json_dump": fn_to_json_string,
    "json_escape": fn_json_escape,
    "from_yaml_string": fn_from_yaml_string,
    "to_yaml_string": fn_to_yaml_string,
    "yaml_parse": fn_from_yaml_string,
    "yaml_dump": fn_to_yaml_string,
    "use_none": fn_use_none,
    "basename": fn_basename,
    "dirname": fn_dirname,
}


def plain(value: Any) -> Any:
    """The JSON form of what an engine returned (tuples, frozen dicts, sets, datetimes)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence | Set) and not isinstance(value, bytes | bytearray):
        return [plain(v) for v in value]
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    raise Refused(f"the result is not JSON data (a {type(value).__name__})")


def bounded(value: Any, limits: Limits) -> Any:
    """``value`` as JSON data, refused when its encoding is larger than the limit."""
    data = plain(value)
    size = len(json.dumps(data, separators=(",", ":"), default=str))
    if size > limits.max_bytes:
        raise Refused(f"the result is {size} bytes, more than the limit of {limits.max_bytes}")
    return data
