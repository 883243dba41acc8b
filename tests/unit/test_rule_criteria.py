"""Rule criteria: each operator, the combinators, and properties over any payload."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.domain.errors import InvalidRuleError
from conveyor.rules import criteria as c
from conveyor.rules.parse import criteria_of, parse_criteria

P = {"body": {"branch": "main", "n": 5, "tags": ["a", "b"], "x": None}, "list": [{"id": 7}], "flag": True}


def check(path: str, op: str, pattern: Any = None) -> bool:
    spec = {"type": op} if op in ("exists", "nexists") else {"type": op, "pattern": pattern}
    return c.matches(criteria_of({path: spec}), P)


@pytest.mark.parametrize(
    ("path", "op", "pattern", "expected"),
    [
        ("trigger.body.branch", "equals", "main", True),
        ("trigger.body.branch", "equals", "Main", False),
        ("trigger.body.branch", "iequals", "MAIN", True),
        ("trigger.body.n", "equals", 5.0, True),
        ("trigger.flag", "equals", 1, False),  # true is not 1
        ("trigger.body.branch", "nequals", "dev", True),
        ("trigger.body.branch", "contains", "ai", True),
        ("trigger.body.tags", "contains", "b", True),
        ("trigger.body", "contains", "branch", True),
        ("trigger.body.tags", "ncontains", "z", True),
        ("trigger.body.branch", "startswith", "ma", True),
        ("trigger.body.branch", "endswith", "in", True),
        ("trigger.body.branch", "regex", "^ma.n$", True),
        ("trigger.body.branch", "regex", "^x", False),
        ("trigger.body.n", "gt", 4, True),
        ("trigger.body.n", "gte", 5, True),
        ("trigger.body.n", "lt", 5, False),
        ("trigger.body.n", "lte", 5, True),
        ("trigger.body.branch", "gt", 3, False),  # a string is not compared with a number
        ("trigger.body.branch", "lt", "n", True),
        ("trigger.body.x", "exists", None, True),  # null is a value
        ("trigger.body.nope", "exists", None, False),
        ("trigger.body.nope", "nexists", None, True),
        ("trigger.body.branch", "in", ["dev", "main"], True),
        ("trigger.body.branch", "nin", ["dev"], True),
        ("trigger.list.0.id", "equals", 7, True),
        ("trigger.list.9.id", "equals", 7, False),
        ("trigger.body.nope", "equals", None, False),  # missing is not null
        ("trigger.body.branch", "lessthan", "z", True),  # StackStorm's spelling
    ],
)
def test_operators(path: str, op: str, pattern: Any, expected: bool) -> None:
    assert check(path, op, pattern) is expected


def test_combinators_and_several_keys() -> None:
    tree = criteria_of({
        "trigger.body.branch": {"type": "equals", "pattern": "main"},
        "or": [
            {"trigger.body.n": {"type": "gt", "pattern": 10}},
            {"not": {"trigger.flag": {"type": "equals", "pattern": False}}},
        ],
    })  # fmt: skip
    assert c.matches(tree, P)
    assert not c.matches(tree, {**P, "flag": False})
    assert c.matches(criteria_of({}), {"anything": 1})  # no criteria: every event


def test_every_problem_is_listed_with_its_path() -> None:
    problems: list[tuple[str, str]] = []
    parse_criteria({
        "body.x": {"type": "equals", "pattern": 1},
        "trigger.a": {"type": "sounds_like", "pattern": 1},
        "trigger.b": {"type": "regex", "pattern": "("},
        "trigger.c": {"type": "regex", "pattern": "a" * (c.MAX_PATTERN + 1)},
        "trigger.d": {"type": "in", "pattern": "x"},
        "trigger.e": {"type": "equals"},
        "and": [],
        "not": {"trigger.f": "main"},
    }, "criteria", problems)  # fmt: skip
    paths = [p for p, _ in problems]
    assert paths == ["criteria.body.x", "criteria.trigger.a.type", "criteria.trigger.b.pattern",
                     "criteria.trigger.c.pattern", "criteria.trigger.d.pattern", "criteria.trigger.e.pattern",
                     "criteria.and", "criteria.not.trigger.f"]  # fmt: skip
    with pytest.raises(InvalidRuleError):
        criteria_of({"trigger.a": {"type": "nope"}})


def test_a_catastrophic_regex_times_out_as_no_match() -> None:
    tree = criteria_of({"trigger.s": {"type": "regex", "pattern": "^(a+)+$"}})
    started = time.monotonic()
    assert not c.matches(tree, {"s": "a" * 5000 + "!"})
    assert time.monotonic() - started < 2


def test_deep_nesting_is_refused() -> None:
    deep: dict[str, Any] = {"trigger.a": {"type": "exists"}}
    for _ in range(c.MAX_DEPTH + 2):
        deep = {"not": deep}
    problems: list[tuple[str, str]] = []
    parse_criteria(deep, "criteria", problems)
    assert problems
    assert "deep" in problems[0][1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from("abxy0"), kids, max_size=4),
    max_leaves=20,
)
OPS = sorted(c.OPERATORS)
checks = st.builds(
    lambda path, op, pattern: {"trigger." + ".".join(path): {"type": op, "pattern": pattern}},
    st.lists(st.sampled_from(["a", "b", "x", "0"]), min_size=1, max_size=3),
    st.sampled_from(OPS),
    json_values,
)
criteria_st = st.recursive(
    checks,
    lambda kids: (
        st.builds(lambda a: {"and": a}, st.lists(kids, min_size=1, max_size=3))
        | st.builds(lambda a: {"or": a}, st.lists(kids, min_size=1, max_size=3))
        | st.builds(lambda a: {"not": a}, kids)
    ),
    max_leaves=8,
)


def tree_of(value: Any) -> c.Criterion:
    return parse_criteria(value, "criteria", [])  # problems ignored: whatever parses is matched


@settings(max_examples=150, deadline=None)
@given(criteria_st, json_values)
def test_no_exception_escapes_and_not_inverts(criteria: Any, payload: Any) -> None:
    tree = tree_of(criteria)
    hit = c.matches(tree, payload)
    assert isinstance(hit, bool)
    assert c.matches(c.Not(tree), payload) is (not hit)


@settings(max_examples=100, deadline=None)
@given(criteria_st, criteria_st, json_values)
def test_and_or_laws(a: Any, b: Any, payload: Any) -> None:
    x, y = tree_of(a), tree_of(b)
    both, either = c.matches(c.All((x, y)), payload), c.matches(c.AnyOf((x, y)), payload)
    assert both == (c.matches(x, payload) and c.matches(y, payload))
    assert either == (c.matches(x, payload) or c.matches(y, payload))
    assert both == c.matches(c.All((y, x)), payload)
    # De Morgan
    assert c.matches(c.Not(c.AnyOf((x, y))), payload) == c.matches(c.All((c.Not(x), c.Not(y))), payload)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=5))
def test_parsing_any_mapping_never_raises(doc: dict[str, Any]) -> None:
    problems: list[tuple[str, str]] = []
    tree = parse_criteria(doc, "criteria", problems)
    c.matches(tree, doc)
