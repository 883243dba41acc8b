"""Unit: conveyor.domain.documents, the one reader of YAML and JSON a user sends (issue
#25, point 1): the billion-laughs document refused before it is expanded (time and peak
memory measured in a process of its own), a key named twice refused at every level, and
a property test over nesting and alias shapes that the count while composing is exact."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.domain.documents import DocumentError, Limits, check, load_json, load_yaml
from conveyor.domain.errors import InvalidRuleError
from conveyor.expressions import ExpressionError, Scope, evaluate
from conveyor.rules import parse as rules
from conveyor.workflows.parse import parse_workflow
from conveyor.workflows.problems import WorkflowError
from support.documents import bomb


def test_the_billion_laughs_workflow_is_refused_with_one_line() -> None:
    text = bomb(7)
    assert len(text) < 500
    with pytest.raises(WorkflowError) as caught:
        parse_workflow(text)
    [problem] = caught.value.problems
    assert problem.message == "the document has more than 1000000 nodes (aliases expanded) (documents.max_nodes)"
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidRuleError, match=r"documents\.max_nodes"):
        rules.load(text)


_MEASURE = textwrap.dedent(
    """
    import resource, sys, time
    sys.path[:0] = [{tests!r}]
    from unit.test_documents import bomb
    from conveyor.domain.documents import DocumentError, load_yaml
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    text = bomb({levels})
    started = time.perf_counter()
    try:
        load_yaml(text)
        refused = False
    except DocumentError:
        refused = True
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(refused, took, before, after)
    """
)


@pytest.mark.parametrize("levels", [7, 8, 9])
def test_refusing_a_bomb_costs_no_memory_and_no_time(levels: int) -> None:
    """In a fresh interpreter: peak RSS before and after, and the time to refuse. The issue
    saw 772 MB and ~7 s for seven levels (an out-of-memory kill for eight)."""
    tests = str(__import__("pathlib").Path(__file__).parent.parent)
    script = _MEASURE.format(tests=tests, levels=levels)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    refused, took, before, after = out.stdout.split()
    grown_mib = (int(after) - int(before)) / 1024
    print(f"\n{levels} levels ({len(bomb(levels))} bytes): refused in {float(took) * 1000:.2f} ms, "
          f"peak RSS {int(after) / 1024:.1f} MiB (+{grown_mib:.2f} MiB)")  # fmt: skip
    assert refused == "True"
    assert float(took) < 1.0
    assert grown_mib < 5


def test_recursive_alias_and_deep_nesting_are_refused() -> None:
    with pytest.raises(DocumentError, match=r"the alias \*a at line 1 is inside its own anchor"):
        load_yaml("&a [*a]")
    with pytest.raises(DocumentError, match="more than 100 levels of nesting"):
        load_yaml("[" * 101 + "]" * 101)
    assert load_yaml("[" * 99 + "]" * 99) is not None
    # Nesting built from aliases counts as the nesting it expands to.
    deep = "a: &a " + "[" * 60 + "]" * 60 + "\nb: [[" + "*a]]"
    with pytest.raises(DocumentError, match="levels of nesting"):
        load_yaml(deep, Limits(max_depth=62))
    assert load_yaml(deep, Limits(max_depth=63))["b"] is not None
    with pytest.raises(DocumentError, match="more than 2 aliases"):
        load_yaml("a: &a x\nb: [*a, *a, *a]", Limits(max_aliases=2))
    with pytest.raises(DocumentError, match="characters of text"):
        load_yaml("a: &a " + "x" * 600 + "\nb: [*a, *a]", Limits(max_bytes=1024))


def test_a_merge_key_may_be_overridden_but_no_key_repeats() -> None:
    assert load_yaml("b: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\n")["c"] == {"x": 3, "y": 2}
    with pytest.raises(DocumentError, match=r"duplicate key 'x' at line 2 \(first at line 1\)"):
        load_yaml("x: 1\nx: 2\n")
    with pytest.raises(DocumentError, match="duplicate key 1 at line 2"):
        load_yaml("1: a\n0x1: b\n")  # the same key, spelled otherwise


def test_keys_are_compared_as_the_json_keys_they_become() -> None:
    # 1 and "1" are one key once stored as JSON: the last would silently win.
    with pytest.raises(DocumentError, match=r"duplicate key '1' at line 2 \(first at line 1\)"):
        load_yaml("1: a\n'1': b\n")
    with pytest.raises(DocumentError, match="duplicate key 'true' at line 2"):
        load_yaml("true: a\n'true': b\n")
    with pytest.raises(DocumentError, match="duplicate key True at line 2"):
        load_yaml("1: a\ntrue: b\n")  # one entry of a Python dict all the same
    assert load_yaml("1: a\n'2': b\nx: c\n") == {1: "a", "2": "b", "x": "c"}


WORKFLOW = """\
ref: tests.dup
input: [who]
tasks:
  a:
    action: core.echo
    input: {message: one}
  b:
    action: core.noop
"""


@pytest.mark.parametrize(
    ("where", "text", "line"),
    [
        ("tasks", WORKFLOW + "  a:\n    action: core.noop\n", 9),
        ("a task's keys", WORKFLOW.replace("    input: {message: one}", "    action: core.noop"), 6),
        ("a task's input", WORKFLOW.replace("{message: one}", "{message: one, message: two}"), 6),
        ("top level", WORKFLOW + "input: [other]\n", 9),
        ("nested vars", WORKFLOW + "vars:\n  - deep: {x: {y: 1, y: 2}}\n", 10),
    ],
)
def test_a_key_named_twice_is_refused_at_every_level(where: str, text: str, line: int) -> None:
    with pytest.raises(WorkflowError) as caught:
        parse_workflow(text)
    [problem] = caught.value.problems
    assert problem.message.startswith("duplicate key "), where
    assert f"at line {line} " in problem.message, (where, problem.message)


def test_rules_refuse_a_repeated_key() -> None:
    rule = "ref: r.one\ntrigger: t\naction: {ref: core.noop}\ntrigger: u\n"
    with pytest.raises(InvalidRuleError, match="duplicate key 'trigger'"):
        rules.load(rule)


def test_json_is_bounded_and_strict() -> None:
    assert load_json('{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    with pytest.raises(DocumentError, match="duplicate key 'a' in a JSON object"):
        load_json('{"a": 1, "b": {"a": 2, "a": 3}}')
    with pytest.raises(DocumentError, match="more than 100 levels"):
        load_json("[" * 101 + "]" * 101)
    with pytest.raises(DocumentError, match="more than 100 levels"):  # past what Python's parser can
        load_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DocumentError, match="more than 1000 nodes"):
        load_json(json.dumps(list(range(1000))), Limits(max_nodes=1000))
    with pytest.raises(ValueError, match="NaN"):
        load_json("[NaN]")
    check({"k": ["v"] * 10})


# -- the property: the count while composing is the count of the expanded document --------

_WORD = st.from_regex(r"x[a-z]{0,3}", fullmatch=True)


@st.composite
def shapes(draw: st.DrawFn) -> str:
    """A YAML flow sequence of anchored levels, each a list mixing words, nested lists and
    aliases of earlier levels (so the expansion can grow exponentially)."""
    levels = draw(st.integers(1, 6))
    parts: list[str] = []
    for n in range(levels):
        items = draw(st.lists(st.one_of(_WORD, st.integers(0, n - 1) if n else _WORD, st.just("[")), max_size=4))
        body: list[str] = []
        for item in items:
            if item == "[":
                deep = draw(st.integers(1, 4))
                body.append("[" * deep + "xy" + "]" * deep)
            elif isinstance(item, int):
                body.append(f"*l{item}")
            else:
                body.append(item)
        parts.append(f"&l{n} [" + ", ".join(body) + "]")
    return "[" + ", ".join(parts) + "]"


def _expanded(value: Any) -> tuple[int, int, int]:
    """(nodes, scalar characters, height) of a value, walked as it expands."""
    if isinstance(value, list):
        counts = [_expanded(v) for v in value]
        return (1 + sum(c[0] for c in counts), sum(c[1] for c in counts), 1 + max((c[2] for c in counts), default=0))
    return 1, len(str(value)), 1


@settings(max_examples=300, deadline=None)
@given(shapes(), st.integers(5, 200), st.integers(2, 12), st.integers(10, 400))
def test_bounded_loading_refuses_exactly_what_expands_past_a_bound(
    text: str, max_nodes: int, max_depth: int, max_bytes: int
) -> None:
    nodes, size, height = _expanded(yaml.safe_load(text))  # small shapes: expanding them is cheap
    limits = Limits(max_depth=max_depth, max_nodes=max_nodes, max_aliases=1000, max_bytes=max_bytes)
    try:
        value = load_yaml(text, limits)
    except DocumentError:
        assert nodes > max_nodes or size > max_bytes or height > max_depth
    else:
        assert (nodes <= max_nodes, size <= max_bytes, height <= max_depth) == (True, True, True)
        assert value == yaml.safe_load(text)


def test_expression_functions_read_with_the_same_bounds() -> None:
    for expression in ("<% from_yaml_string('a: 1\na: 2') %>", """<% from_json_string('{"a": 1, "a": 2}') %>"""):
        with pytest.raises(ExpressionError, match="duplicate key 'a'"):
            evaluate(expression, Scope(ctx={}))
    deep = "[" * 101 + "]" * 101
    with pytest.raises(ExpressionError, match="levels of nesting"):
        evaluate(f"<% json('{deep}') %>", Scope(ctx={}))
