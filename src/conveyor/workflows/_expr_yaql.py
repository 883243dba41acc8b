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
from typing import Any, Final

import yaql  # type: ignore[import-untyped]
from yaql.language import contexts, exceptions, specs, utils  # type: ignore[import-untyped]

from conveyor.workflows._expr_core import FUNCTIONS, Evaluation, Refused, current

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
    context = yaql.create_context(context=_DeadlineContext())
    # A child layer: these shadow yaql's own of the same name (its ``pow``).
    context = context.create_child_context()
    for name, fn in FUNCTIONS.items():
        context.register_function(_wrap(fn, name))
    context.register_function(_pow, name="pow")
    return engine, context


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


def evaluate(text: str, ev: Evaluation) -> Any:
    _, base = _base()
    context = base.create_child_context()
    # ``$`` is the workflow's variables, as in Orquesta (``$.name`` == ``ctx(name)``).
    context["$"] = utils.convert_input_data(ev.ctx_view)
    return parse(text).evaluate(context=context)
