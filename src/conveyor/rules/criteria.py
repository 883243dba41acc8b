"""Rule criteria: StackStorm's ``{"trigger.path": {"type": OP, "pattern": P}}`` with
explicit ``and`` / ``or`` / ``not`` combinators, parsed once into a small tree and matched
by a pure function that never raises, whatever the payload (tests/unit/test_rule_criteria.py
has the hypothesis properties).

Paths are dotted from ``trigger`` (the event's payload): ``trigger.body.commits.0.id``
reaches into objects by key and into lists by index; a key holding a dot or a bracket (or
written StackStorm's way) is quoted in brackets: ``trigger.headers['x-github-event']``,
``trigger.body["a.b"]``, ``trigger.body.commits[0]`` (see :func:`split_path`). A path that leads nowhere is
*missing*: every operator is false on it except ``nexists`` (and the other negations,
which are exactly ``not`` of their operator).

Regular expressions use the ``regex`` package, not ``re``: a pattern like ``(a+)+$`` on a
long payload backtracks for hours, and ``re`` cannot be interrupted (it holds the GIL in
C), so one hostile rule or event would hang the executor's event loop. ``regex`` takes a
``timeout=``; a match that runs out of time counts as no match. Patterns are also bounded
in length and compiled at registration, so a broken one is refused with its path.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import regex

MAX_PATTERN: Final = 1000  # characters of one regex
REGEX_SECONDS: Final = 0.05  # one match; a timeout is "no match"
MAX_DEPTH: Final = 32  # nesting of and/or/not
MAX_NODES: Final = 1000  # checks and combinators in one rule
MAX_PATH: Final = 64  # segments of one path


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()

# Operator names: ours, and StackStorm's spellings of the same thing.
ALIASES: Final = {
    "eq": "equals",
    "ieq": "iequals",
    "greaterthan": "gt",
    "lessthan": "lt",
    "inside": "in",
    "ninside": "nin",
    "neq": "nequals",
}
POSITIVE: Final = frozenset(
    {"equals", "iequals", "contains", "startswith", "endswith", "regex", "gt", "gte", "lt", "lte", "exists", "in"}
)
NEGATIONS: Final = {
    "nequals": "equals",
    "ncontains": "contains",
    "nregex": "regex",
    "nexists": "exists",
    "nin": "in",
    "nstartswith": "startswith",
    "nendswith": "endswith",
}
OPERATORS: Final = POSITIVE | frozenset(NEGATIONS) | frozenset(ALIASES)


@dataclass(frozen=True, slots=True)
class Check:
    path: tuple[str, ...]  # after "trigger"
    op: str  # a positive operator
    pattern: Any
    negate: bool = False


@dataclass(frozen=True, slots=True)
class All:
    items: tuple[Criterion, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    items: tuple[Criterion, ...]


@dataclass(frozen=True, slots=True)
class Not:
    item: Criterion


Criterion = Check | All | AnyOf | Not
ALWAYS: Final = All(())


def matches(criterion: Criterion, payload: Any) -> bool:
    """Whether ``payload`` meets ``criterion``. Pure; raises nothing for any JSON payload."""
    if isinstance(criterion, Check):
        try:
            hit = _check(criterion.op, lookup(payload, criterion.path), criterion.pattern)
        except Exception:
            hit = False
        return hit != criterion.negate
    if isinstance(criterion, All):
        return all(matches(c, payload) for c in criterion.items)
    if isinstance(criterion, AnyOf):
        return any(matches(c, payload) for c in criterion.items)
    return not matches(criterion.item, payload)


# One segment after "trigger": .name (anything but . [ ] and quotes), ['key'], ["key"] or [0].
_SEGMENT: Final = regex.compile(r"""\.([^.\[\]'"]+)|\['([^']*)'\]|\["([^"]*)"\]|\[(\d+)\]""")


def split_path(key: str) -> tuple[str, ...] | None:
    """The segments of a criteria key after ``trigger``, or None when ``key`` is not a
    path. Without the bracket form a header such as ``x-github-event`` was reachable only
    dotted, and ``trigger.headers['x-github-event']`` (what the webhook docs and
    StackStorm show) parsed as one odd key that never matched: silently a dead rule."""
    if not key.startswith("trigger"):
        return None
    parts: list[str] = []
    at = len("trigger")
    while at < len(key):
        m = _SEGMENT.match(key, at)
        if m is None:
            return None
        parts.append(next(g for g in m.groups() if g is not None))
        at = m.end()
    return tuple(parts)


def lookup(payload: Any, path: Sequence[str]) -> Any:
    value = payload
    for part in path:
        if isinstance(value, Mapping):
            value = value.get(part, MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _number(a) and _number(b):
        return bool(a == b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _check(op: str, value: Any, pattern: Any) -> bool:
    if op == "exists":
        return value is not MISSING
    if value is MISSING:
        return False
    if op == "equals":
        return same(value, pattern)
    if op == "iequals":
        return isinstance(value, str) and isinstance(pattern, str) and value.casefold() == pattern.casefold()
    if op == "in":
        return isinstance(pattern, list) and any(same(value, p) for p in pattern)
    if op == "contains":
        if isinstance(value, str):
            return isinstance(pattern, str) and pattern in value
        if isinstance(value, list):
            return any(same(v, pattern) for v in value)
        return isinstance(value, Mapping) and isinstance(pattern, str) and pattern in value
    if op in ("startswith", "endswith"):
        if not (isinstance(value, str) and isinstance(pattern, str)):
            return False
        return value.startswith(pattern) if op == "startswith" else value.endswith(pattern)
    if op == "regex":
        if not isinstance(value, str) or not isinstance(pattern, str):
            return False
        try:
            return _compiled(pattern).search(value, timeout=REGEX_SECONDS) is not None
        except TimeoutError:
            return False
    # gt/gte/lt/lte: numbers with numbers, strings with strings; anything else: false.
    if not ((_number(value) and _number(pattern)) or (isinstance(value, str) and isinstance(pattern, str))):
        return False
    if op == "gt":
        return bool(value > pattern)
    if op == "gte":
        return bool(value >= pattern)
    if op == "lt":
        return bool(value < pattern)
    return bool(value <= pattern)


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern, regex.DOTALL)


def regex_problem(pattern: Any) -> str | None:
    if not isinstance(pattern, str):
        return "a regex pattern must be a string"
    if len(pattern) > MAX_PATTERN:
        return f"a regex pattern may have at most {MAX_PATTERN} characters"
    try:
        _compiled(pattern)
    except regex.error as exc:
        return f"invalid regex: {exc}"
    return None
