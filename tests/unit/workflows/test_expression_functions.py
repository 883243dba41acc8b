"""The functions Orquesta (and StackStorm's Orquesta runner) workflows commonly use beyond
the workflow functions: ``zip``, ``json``, YAML/JSON helpers, ordered ``keys``/``values``/
``items``, ``format``, yaql's camelCase method names; each bounded like the rest."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.expressions import ExpressionError, Scope, evaluate
from conveyor.workflows.parse import parse_workflow

SCOPE = Scope(
    {
        "a": [1, 2, 3],
        "b": ["x", "y"],
        "d": {"z": 1, "a": 2, "m": 3},
        "text": '{"k": [1, 2]}',
        "yml": "k: [1, 2]\nname: bob\n",
        "quoted": 'say "hi"\n',
        "path": "/srv/app/deploy.sh",
    }
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # Orquesta's zip: pads to the longest (None, or pad), one list is returned as is.
        ("<% zip($.a, $.b) %>", [[1, "x"], [2, "y"], [3, None]]),
        ("<% zip(ctx(a), ctx(b), pad => 0) %>", [[1, "x"], [2, "y"], [3, 0]]),
        ("<% zip($.a) %>", [1, 2, 3]),
        ("<% zip($.b, null) %>", [["x", None], ["y", None]]),
        ("{{ zip(ctx('a'), ctx('b')) }}", [[1, "x"], [2, "y"], [3, None]]),
        ("{{ zip(ctx('b'), ctx('a'), pad='-') }}", [["x", 1], ["y", 2], ["-", 3]]),
        ("<% json($.text) %>", {"k": [1, 2]}),
        ("<% json($.d) %>", {"z": 1, "a": 2, "m": 3}),
        ("{{ json(ctx('text')).k }}", [1, 2]),
        ("<% json_parse($.text).k %>", [1, 2]),
        ("<% json_dump($.b) %>", '["x", "y"]'),
        ("<% json_escape($.quoted) %>", 'say \\"hi\\"\\n'),
        ("<% from_yaml_string($.yml) %>", {"k": [1, 2], "name": "bob"}),
        ("<% yaml_parse($.yml).name %>", "bob"),
        ("<% to_yaml_string($.b) %>", "- x\n- y\n"),
        ("<% basename($.path) %>", "deploy.sh"),
        ("<% dirname($.path) %>", "/srv/app"),
        ("<% use_none(null) %>", None),
        # keys/values/items in the mapping's order, as methods and as functions.
        ("<% $.d.keys() %>", ["z", "a", "m"]),
        ("<% keys($.d) %>", ["z", "a", "m"]),
        ("<% $.d.values() %>", [1, 2, 3]),
        ("<% values($.d) %>", [1, 2, 3]),
        ("<% $.d.items() %>", [["z", 1], ["a", 2], ["m", 3]]),
        ("<% items($.d).select($[0]) %>", ["z", "a", "m"]),
        ("<% dict($.d.items()) %>", {"z": 1, "a": 2, "m": 3}),
        # yaql's standard library, under the names Orquesta's yaql context gives them.
        ("<% len($.a) %>", 3),
        ("<% len($.d) %>", 3),
        ("<% dict(k => 1) %>", {"k": 1}),
        ("<% list(1, 2) %>", [1, 2]),
        ("<% range(3) %>", [0, 1, 2]),
        ("<% str(5) %>", "5"),
        ("<% int('7') + 1 %>", 8),
        ("<% ','.join($.b) %>", "x,y"),
        ("<% $.b.join('-') %>", "x-y"),
        ("<% 'a'.toUpper() %>", "A"),
        ("<% $.a.orderBy(-$) %>", [3, 2, 1]),
        ("<% $.d.containsKey(z) %>", True),
        ("<% 'abc'.startsWith(ab) %>", True),
        ("<% '{0}-{1}'.format(1, two) %>", "1-two"),
        ("<% '{host}:{port:>5}'.format(host => h, port => 80) %>", "h:   80"),
        ("<% format('{0}!', 1) %>", "1!"),
    ],
)
def test_functions(expression: str, expected: Any) -> None:
    assert evaluate(expression, SCOPE) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("<% '{0.__class__}'.format(1) %>", "only positions and names"),
        ("<% '{0[0]}'.format($.a) %>", "only positions and names"),
        ("<% '{0:>999999999}'.format(1) %>", "is not allowed"),
        ("<% '{0:{1}}'.format(1, 9) %>", "is not allowed"),
        ("<% '{3}'.format(1) %>", "format: IndexError"),
        # Eleven lists of 100,000: past zip's own bound, before any result is built.
        ("<% zip(" + ", ".join(["range(100000)"] * 11) + ") %>", "is too large"),
        ("<% from_yaml_string('a: &x [1]\nb: *x') %>", "aliases"),
        ("<% json(1) %>", "json() takes text or a mapping"),
    ],
)
def test_refused(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        evaluate(expression, SCOPE)
    assert message in caught.value.message


def test_orquesta_named_zipped_items_parse_and_evaluate() -> None:
    spec = parse_workflow(
        "tasks: {t: {with: 'm, n in <% zip(ctx(ms), ctx(ns)) %>', action: core.echo message=<% item(m) %>}}",
        ref="t.wf",
    )
    with_items = spec.tasks["t"].with_items
    assert with_items is not None
    assert with_items.var == "m, n"
    items = evaluate(with_items.items, Scope({"ms": ["a", "b"], "ns": [1, 2]}))
    assert items == [["a", 1], ["b", 2]]
    one = Scope({}, item=items[1], index=1, item_vars=("m", "n"))
    assert evaluate("<% item(m) %>-<% item(n) %>", one) == "b-2"


@pytest.mark.parametrize(
    "expression",
    [
        '<% regex("(a+)+b").matches("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") %>',
        '<% "aaaaaaaaaaaaaaaaaaaaaa!" =~ "(a+)+$" %>',
    ],
)
def test_regular_expressions_are_not_offered(expression: str) -> None:
    """Python's re cannot be interrupted by the time bound: a catastrophic pattern would
    hang the advancement, so yaql's regex library is left out."""
    with pytest.raises(ExpressionError, match="Unknown function"):
        evaluate(expression, Scope(ctx={}))
