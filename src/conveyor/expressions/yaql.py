"""YAQL (``<% ... %>``) through the maintained ``yaql`` package, bounded.

Bounds: yaql's own ``limitIterators`` (no collection longer than :data:`MAX_ITEMS`) and
``memoryQuota`` options, plus the deadline of the evaluation checked at every function
call (every operator, method and lambda body in YAQL is a function call, so a loop cannot
run long without passing through the check). ``pow`` is replaced by one that refuses
results too large to compute in time. YAQL has no attribute access to Python objects
(``obj.name`` only reaches registered ``#property#`` functions; identifiers starting with
``_`` do not even lex), so there is no escape to Python internals.
"""

from __future__ import annotations

# yaql 3.2 uses ``collections.Iterable`` & co, which Python 3.10+ only has once
# ``collections.abc`` is imported: a bug in yaql, worked around by importing it first.
import collections.abc  # noqa: F401  (must come before yaql)
import functools
import math
import re
import string
from typing import Any, Final

import yaql  # type: ignore[import-untyped]
from yaql.language import (  # type: ignore[import-untyped]
    contexts,
    conventions,
    exceptions,
    expressions,
    specs,
    utils,
    yaqltypes,
)
from yaql.standard_library import queries  # type: ignore[import-untyped]

from conveyor.expressions.core import FUNCTIONS, Evaluation, Refused, current

# A ``with`` of 10,000 items must work; ten times that is the largest collection allowed.
MAX_ITEMS: Final = 100_000
# Shallow bytes of any one intermediate value (yaql measures with sys.getsizeof).
MEMORY_QUOTA: Final = 16 << 20


class _DeadlineContext(contexts.Context):  # type: ignore[misc]
    """A yaql context that checks the evaluation's deadline at every function lookup.

    yaql creates child contexts with ``type(self)(self)``, so every context of an
    evaluation is one of these."""

    def collect_functions(self, name: str, predicate: Any = None, use_convention: bool = False) -> Any:
        current()
        return super().collect_functions(name, predicate, use_convention)


def _pow(base: Any, exponent: Any, modulo: Any = None) -> Any:
    # ``pow(10, 10000000000)`` would run in C for hours, past any deadline: refuse results
    # that would not fit in the size limit anyway.
    ev = current()
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and modulo is None
        and abs(base) > 1
        and exponent > 0
        and exponent * math.log2(abs(base)) > ev.limits.max_bytes * 8
    ):
        raise Refused(f"pow({base}, {exponent}) is too large")
    return pow(base, exponent, modulo) if modulo is not None else pow(base, exponent)


# yaql's own keys()/values()/items() return dict views, which its output conversion turns
# into sets: keys lose their order and items() fails (a set of lists). These return lists in
# the mapping's order, as methods (``$.d.items()``) and as functions (``items($.d)``).
def _keys(d: Any) -> list[Any]:
    return list(d.keys())


def _values(d: Any) -> list[Any]:
    return list(d.values())


def _items(d: Any) -> list[list[Any]]:
    return [[k, v] for k, v in d.items()]


# Python's format fields reach attributes and indexes (``{0.__class__}``) and widths make
# any size (``{0:>999999999}``): only plain fields, conversions and small specs are allowed.
_FIELD: Final = re.compile(r"^\w*$")
_SPEC: Final = re.compile(r"^[^{}]*$")
_WIDTH: Final = re.compile(r"\d+")


def _format(template: str, *args: Any, **kwargs: Any) -> str:
    """``"{0} on {host}".format(x, host => h)``: Python's str.format, fields checked."""
    ev = current()
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if not _FIELD.fullmatch(field):
            raise Refused(f"format field {{{field}}}: only positions and names are allowed")
        if spec and (not _SPEC.fullmatch(spec) or any(int(w) > ev.limits.max_bytes for w in _WIDTH.findall(spec))):
            raise Refused(f"format spec {spec!r} is not allowed")
    try:
        return template.format(*args, **kwargs)
    except (IndexError, KeyError, ValueError) as exc:
        raise Refused(f"format: {exc!r}") from None


def _sum(operator: Any, collection: Any, initial: Any = utils.NO_VALUE) -> Any:
    # yaql's own ``sum`` is a method only (``$.l.sum()``): ``sum(l)``, which Orquesta's
    # users write and docs/workflows.md lists, was "Unknown function". An empty collection
    # sums to 0, as in Python (yaql's fails on it).
    items = list(collection)
    if not items and initial is utils.NO_VALUE:
        return 0
    return queries.aggregate(items, operator, initial)


def _sum_definition() -> Any:
    fn = specs.inject("operator", yaqltypes.Delegate("#operator_+"))(_sum)
    return _extension(fn, "sum", "collection", yaqltypes.Iterable())


def _extension(fn: Any, name: str, receiver: str, kind: Any) -> Any:
    """``fn`` as a yaql function callable as ``name(x, ...)`` and ``x.name(...)`` (the
    decorators applied here, not on ``fn``: yaql's are untyped)."""
    return specs.extension_method(specs.name(name)(specs.parameter(receiver, kind)(fn)))


def _wrap(fn: Any, name: str) -> Any:
    """A yaql function definition for one of the shared workflow functions."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return utils.convert_input_data(fn(*args, **kwargs))

    return specs.get_function_definition(call, name=name)


@functools.lru_cache(maxsize=1)
def _base() -> tuple[Any, Any]:
    engine = yaql.factory.YaqlFactory().create(
        options={
            "yaql.limitIterators": MAX_ITEMS,
            "yaql.memoryQuota": MEMORY_QUOTA,
            "yaql.convertInputData": True,
            "yaql.convertOutputData": True,
        }
    )
    # CamelCaseConvention: yaql.create_context()'s default, which Orquesta uses: its
    # workflows write `toUpper()`, `orderBy()`, `startsWith()`, `containsKey()`.
    # regex=False: yaql's regular expressions run Python's ``re``, which no deadline can
    # interrupt (a catastrophic pattern would hang the executor's advancement), so
    # ``regex()``, ``matches``, ``=~``, ``search`` and friends are not offered.
    context = yaql.create_context(context=_DeadlineContext(convention=conventions.CamelCaseConvention()), regex=False)
    # A child layer: these shadow yaql's own of the same name (its ``pow``).
    context = context.create_child_context()
    for name, fn in FUNCTIONS.items():
        context.register_function(_wrap(fn, name))
    context.register_function(_pow, name="pow")
    for name, fn in (("keys", _keys), ("values", _values), ("items", _items)):
        context.register_function(_extension(fn, name, "d", utils.MappingType))
    context.register_function(_extension(_format, "format", "template", yaqltypes.String()))
    context.register_function(_sum_definition())
    return engine, context


def ready() -> None:
    """Build the engine now (once per process: 0.3-1 s on a busy machine), so that it is not
    charged to the first expression's time bound."""
    _base()


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> Any:
    """The parsed expression (raises yaql's exceptions on a syntax error)."""
    engine, _ = _base()
    return engine(text)


def syntax_error(text: str) -> str | None:
    try:
        parse(text)
    except (exceptions.YaqlException, ValueError, TypeError) as exc:
        return str(exc)
    return None


def unknown_functions(text: str) -> list[str]:
    """The functions ``text`` calls that do not exist, as ``name()`` (a call) or ``.name()``
    (a method: ``x.name()``); by looking them up, nothing is evaluated. ``text`` parses."""
    _, context = _base()
    missing: list[str] = []
    stack: list[tuple[Any, bool]] = [(parse(text), False)]
    while stack:
        node, as_method = stack.pop()
        if type(node) is expressions.Function:  # operators, indexers, ... are Function subclasses
            # The base Context's lookup: ours checks an evaluation's deadline, and there is none.
            found = [f for layer in contexts.Context.collect_functions(context, node.name) for f in layer]
            if not any(f.is_method if as_method else f.is_function for f in found):
                missing.append(f".{node.name}()" if as_method else f"{node.name}()")
        if isinstance(node, expressions.MappingRuleExpression):
            stack += [(node.source, False), (node.destination, False)]
        args = list(getattr(node, "args", None) or ())
        method_call = isinstance(node, expressions.BinaryOperator) and node.name == "#operator_." and len(args) == 2
        stack += [(arg, method_call and i == 1) for i, arg in enumerate(args)]
    return sorted(set(missing))


def evaluate(text: str, ev: Evaluation) -> Any:
    _, base = _base()
    context = base.create_child_context()
    # ``$`` is the workflow's variables, as in Orquesta (``$.name`` == ``ctx(name)``).
    context["$"] = utils.convert_input_data(ev.ctx_view)
    return parse(text).evaluate(context=context)
