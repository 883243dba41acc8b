"""Jinja2 (``{{ ... }}``, and ``{% ... %}`` blocks in text) in its immutable sandbox, bounded.

The sandbox already refuses attributes starting with ``_`` and mutation of lists, dicts
and sets; here such an access raises at once (instead of yielding an undefined that might
be printed), and every attribute, item, call, filter and intercepted operator checks the
evaluation's deadline. Sizes: ``*`` and ``**`` refuse results over the size limit before
computing them, the padding filters and methods refuse widths over it, any attribute or
item read that yields an oversized string or list is refused (this bounds loops that
double a string), and rendered text is counted as it is produced.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sized
from typing import Any, Final

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, nodes
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conveyor.expressions.core import FUNCTIONS, Evaluation, Refused, current

# Filters and str methods whose integer argument is a size to allocate.
_WIDTH_TAKERS: Final = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "indent", "wordwrap"})
# A printf-style width or precision of seven digits or more ("%1000000d") allocates megabytes.
_HUGE_FORMAT = re.compile(r"[%{:][^%{}]*?\d{7,}")


def _too_big(value: Any, limit: int) -> bool:
    return isinstance(value, str | bytes | list | tuple | dict) and len(value) > limit


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        raise Refused(f"access to {attribute!r} of a {type(obj).__name__} is not allowed")

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self._checked(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        return self._checked(super().getitem(obj, argument))

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        ev = current()
        name = getattr(__obj, "__name__", "")
        if name in _WIDTH_TAKERS or name == "format":
            _refuse_sizes(name, args, kwargs, ev.limits.max_bytes)
        # str.format arrives wrapped by the sandbox: the format string is the receiver.
        receiver = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if isinstance(receiver, str) and _HUGE_FORMAT.search(receiver):
            raise Refused("a format width that large is not allowed")
        return __self._checked(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        ev = current()
        limit = ev.limits.max_bytes
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, Sized) and not isinstance(seq, dict) and isinstance(n, int) and len(seq) * n > limit:
                    raise Refused(f"a result of {len(seq) * n} elements is larger than the limit")
        elif operator == "**":
            huge = isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0
            if huge and right * math.log2(abs(left)) > limit * 8:
                raise Refused(f"{left} ** {right} is too large")
        elif operator == "%" and isinstance(left, str) and _HUGE_FORMAT.search(left):
            raise Refused("a format width that large is not allowed")
        return self._checked(super().call_binop(context, operator, left, right))

    @staticmethod
    def _checked(value: Any) -> Any:
        ev = current()
        if _too_big(value, ev.limits.max_bytes):
            raise Refused(f"a value of {len(value)} elements is larger than the limit")
        return value


def _refuse_sizes(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and value > limit:
            raise Refused(f"{name}() with a size of {value} is not allowed")
        if isinstance(value, str) and name == "format" and _HUGE_FORMAT.search(value):
            raise Refused("a format width that large is not allowed")


def _guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    # Filters are called directly by compiled templates (not through ``call``), so each is
    # wrapped; functools.wraps keeps Jinja's pass_context/pass_environment marks.
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        ev = current()
        if name in _WIDTH_TAKERS or name == "format":
            _refuse_sizes(name, args[1:], kwargs, ev.limits.max_bytes)
        return _Sandbox._checked(fn(*args, **kwargs))

    return guarded


@functools.lru_cache(maxsize=1)
def environment() -> _Sandbox:
    env = _Sandbox(undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals.pop("lipsum", None)  # generates text of a size it is told: not needed
    env.globals.update(FUNCTIONS)
    env.filters.update({name: _guard_filter(name, fn) for name, fn in env.filters.items()})
    return env


@functools.lru_cache(maxsize=4096)
def _expression(text: str) -> Any:
    return environment().compile_expression(text, undefined_to_none=False)


@functools.lru_cache(maxsize=1024)
def _template(text: str) -> Any:
    return environment().from_string(text)


def syntax_error(text: str, *, template: bool = False) -> str | None:
    """Jinja's message for ``text`` (an expression, or a whole template), None if it parses."""
    try:
        if template:
            environment().parse(text)
        else:
            # Parse only: compiling would not evaluate either, but parse is all we need.
            environment().parse("{{ " + text + " }}")
    except TemplateSyntaxError as exc:
        return f"{exc.message} (line {exc.lineno})" if template else str(exc.message)
    return None


def unknown_functions(text: str, *, template: bool = False) -> list[str]:
    """The functions, filters and tests ``text`` (an expression, or a whole template) uses
    that do not exist: ``name()``, ``| name``, ``is name``. Jinja only finds an unknown
    function when it is called, at run time. ``text`` parses; nothing is evaluated."""
    env = environment()
    tree = env.parse(text if template else "{{ " + text + " }}")
    # Names a template binds itself ({% set %}, {% macro %}, loop and call arguments).
    bound = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    bound |= {m.name for m in tree.find_all(nodes.Macro)}
    missing = [
        f"{call.node.name}()"
        for call in tree.find_all(nodes.Call)
        if isinstance(call.node, nodes.Name) and call.node.name not in env.globals and call.node.name not in bound
    ]
    missing += [f"| {f.name}" for f in tree.find_all(nodes.Filter) if f.name not in env.filters]
    missing += [f"is {t.name}" for t in tree.find_all(nodes.Test) if t.name not in env.tests]
    return sorted(set(missing))


def _values(ev: Evaluation) -> dict[str, Any]:
    # Orquesta's Jinja sees the workflow variables through ctx() only; ``_`` is Mistral's
    # name for them, kept because old workflows use it.
    if ev.scope.jinja_names:
        return {**{k: v for k, v in ev.ctx_view.items() if k.isidentifier()}, "_": dict(ev.ctx_view)}
    return {"_": dict(ev.ctx_view)}


def evaluate(text: str, ev: Evaluation) -> Any:
    """The native value of one ``{{ expression }}``'s inner text."""
    value = _expression(text)(**_values(ev))
    if isinstance(value, Undefined):
        raise Refused(f"{value._undefined_message}")
    return value


def render(text: str, ev: Evaluation) -> str:
    """A whole template (text with ``{{ }}`` and ``{% %}``), counted as it is produced."""
    produced: list[str] = []
    size = 0
    for chunk in _template(text).generate(**_values(ev)):
        ev.check()
        size += len(chunk)
        if size > ev.limits.max_bytes:
            raise Refused(f"the text is longer than the limit of {ev.limits.max_bytes}")
        produced.append(chunk)
    return "".join(produced)
