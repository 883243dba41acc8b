"""Workflow expressions: YAQL ``<% ... %>`` and Jinja2 ``{{ ... }}``, as Orquesta has them.

:func:`evaluate` walks a value (dicts, lists, strings): a string that is exactly one
expression becomes the expression's native value (a list stays a list); a string mixing
text and expressions becomes text, each expression's value inserted as is when it is a
string and as JSON otherwise. A string with Jinja blocks (``{% ... %}``) is rendered as a
Jinja template. Everything else is returned unchanged.

Both engines see the same functions: ``ctx()`` / ``ctx(name)``, ``result()``,
``succeeded()``, ``failed()``, ``completed()``, ``item()`` / ``item(name)``,
``task(name)`` (``{"status", "result"}``), ``task_status(name)``, ``to_json_string(v)``,
``from_json_string(s)``; in YAQL ``$`` is the variables too (``$.name``).

Evaluation is bounded (:class:`Limits`: wall time and result size for one call) and
sandboxed; whatever goes wrong inside (a bound, the sandbox, a missing variable, a bug in
an engine) is raised as :class:`ExpressionError` naming the expression, never as anything
else, so the conductor can fail the workflow with it instead of crashing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from conveyor.expressions import jinja as _expr_jinja
from conveyor.expressions import yaql as _expr_yaql
from conveyor.expressions.core import (
    CURRENT,
    DEFAULT_LIMITS,
    MISSING,
    Evaluation,
    ExpressionError,
    Limits,
    Refused,
    Scope,
    begin,
    bounded,
    item_vars,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MISSING",
    "ExpressionError",
    "Limits",
    "Scope",
    "evaluate",
    "has_expression",
    "item_vars",
    "syntax_errors",
    "unknown_functions",
]

# One expression: YAQL, Jinja expression, Jinja block. Non-greedy: the first closer ends it.
_TOKEN: Final = re.compile(r"<%(.*?)%>|\{\{(.*?)\}\}|\{%(.*?)%\}", re.DOTALL)
_OPENERS: Final = ("<%", "{{", "{%")


def has_expression(text: str) -> bool:
    """Whether ``text`` holds an expression (or the start of one)."""
    return any(opener in text for opener in _OPENERS)


def evaluate(value: Any, scope: Scope, limits: Limits = DEFAULT_LIMITS) -> Any:
    """``value`` with every expression in it evaluated in ``scope`` (see the module doc).

    Raises :class:`ExpressionError` and nothing else."""
    _expr_yaql.ready()  # before the clock starts: the engine is built once, not per expression
    try:
        ev = begin(scope, limits)
    except Refused as exc:
        raise ExpressionError(_shown(value), str(exc)) from None
    token = CURRENT.set(ev)
    try:
        result = _walk(value, ev)
        try:
            return bounded(result, limits) if result is not value else result
        except Refused as exc:
            raise ExpressionError(_shown(value), str(exc)) from None
    finally:
        CURRENT.reset(token)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


def _walk(value: Any, ev: Evaluation) -> Any:
    if isinstance(value, str):
        return _string(value, ev) if has_expression(value) else value
    if isinstance(value, Mapping):
        return {k: _walk(v, ev) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, ev) for v in value]
    return value


def _string(text: str, ev: Evaluation) -> Any:
    try:
        ev.check()
        tokens = list(_TOKEN.finditer(text))
        _refuse_unterminated(text, tokens)
        if any(m.group(3) is not None for m in tokens):
            return _expr_jinja.render(text, ev)
        if len(tokens) == 1 and tokens[0].group(0) == text.strip():
            return bounded(_one(tokens[0], ev), ev.limits)
        parts: list[str] = []
        at = 0
        for m in tokens:
            parts.append(text[at : m.start()])
            value = bounded(_one(m, ev), ev.limits)
            parts.append(value if isinstance(value, str) else json.dumps(value))
            at = m.end()
        parts.append(text[at:])
        return bounded("".join(parts), ev.limits)
    except ExpressionError:
        raise
    except Refused as exc:
        raise ExpressionError(_shown(text), str(exc)) from None
    except KeyError as exc:
        raise ExpressionError(_shown(text), f"no key {exc}") from None
    except Exception as exc:  # any engine failure is the expression's failure, by contract
        raise ExpressionError(_shown(text), _message(exc)) from None


def _one(m: re.Match[str], ev: Evaluation) -> Any:
    try:
        if m.group(1) is not None:
            return _expr_yaql.evaluate(m.group(1).strip(), ev)
        return _expr_jinja.evaluate(m.group(2).strip(), ev)
    except Refused as exc:
        raise ExpressionError(m.group(0), str(exc)) from None
    except KeyError as exc:
        raise ExpressionError(m.group(0), f"no key {exc}") from None
    except Exception as exc:  # see _string
        raise ExpressionError(m.group(0), _message(exc)) from None


def _message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


def _refuse_unterminated(text: str, tokens: list[re.Match[str]]) -> None:
    rest = _TOKEN.sub("", text) if tokens else text
    for opener in _OPENERS:
        if opener in rest:
            raise Refused(f"{opener} is not closed")


def syntax_errors(value: Any) -> list[str]:
    """The syntax errors of every expression in ``value`` (walked like :func:`evaluate`),
    found by parsing only: nothing is evaluated. Empty when all parse."""
    return [error for text in _expressions(value) for error in _string_errors(text)]


def _expressions(value: Any) -> Iterator[str]:
    """Every string in ``value`` that holds an expression, walked like :func:`evaluate`."""
    if isinstance(value, str):
        if has_expression(value):
            yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _expressions(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _expressions(v)


def _string_errors(text: str) -> list[str]:
    tokens = list(_TOKEN.finditer(text))
    errors: list[str] = []
    try:
        _refuse_unterminated(text, tokens)
    except Refused as exc:
        errors.append(f"{_shown(text)!r}: {exc}")
    if any(m.group(3) is not None for m in tokens):
        message = _expr_jinja.syntax_error(text, template=True)
        return [*errors, f"{_shown(text)!r}: {message}"] if message else errors
    for m in tokens:
        inner = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        if not inner:
            errors.append(f"{m.group(0)!r}: empty expression")
            continue
        message = _expr_yaql.syntax_error(inner) if m.group(1) is not None else _expr_jinja.syntax_error(inner)
        if message:
            errors.append(f"{m.group(0)!r}: {message}")
    return errors


def unknown_functions(value: Any) -> list[str]:
    """For every expression in ``value`` (walked like :func:`evaluate`) that parses and calls
    a function, filter or test that does not exist: ``'<% sum2(x) %>': unknown function
    sum2()``. Registration refuses these: at run time they would fail the workflow."""
    return [name for text in _expressions(value) if not _string_errors(text) for name in _string_unknown(text)]


def _string_unknown(text: str) -> list[str]:
    tokens = list(_TOKEN.finditer(text))
    if any(m.group(3) is not None for m in tokens):
        names = _expr_jinja.unknown_functions(text, template=True)
        return [f"{_shown(text)!r}: unknown {_what(n)} {n}" for n in names]
    found: list[str] = []
    for m in tokens:
        inner = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        names = _expr_yaql.unknown_functions(inner) if m.group(1) is not None else _expr_jinja.unknown_functions(inner)
        found += [f"{m.group(0)!r}: unknown {_what(n)} {n}" for n in names]
    return found


def _what(name: str) -> str:
    if name.startswith("| "):
        return "filter"
    if name.startswith("is "):
        return "test"
    return "method" if name.startswith(".") else "function"
