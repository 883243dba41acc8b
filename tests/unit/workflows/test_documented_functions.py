"""Unit: every function docs/workflows.md lists runs, and registration refuses a call of
one that does not exist (issue #25, point 12: ``sum`` was listed, accepted at registration
and failed at run time with "Unknown function").

The names are parsed out of the doc's "Functions" section, so a function added to the doc
without an example here fails, as does an example that no longer runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from conveyor.domain.errors import InvalidRuleError
from conveyor.expressions import Scope, evaluate, unknown_functions
from conveyor.rules import parse as rules
from conveyor.workflows.parse import parse_workflow
from conveyor.workflows.validate import validate

DOC = Path(__file__).parents[3] / "docs" / "workflows.md"
SCOPE = Scope(
    ctx={"l": [3, 1, 2], "d": {"a": 1}, "s": "a b", "p": "/x/y.txt", "j": '{"k": 1}'},
    result={"stdout": "ok"},
    status="succeeded",
    item="it",
    index=0,
    tasks={"t": {"status": "succeeded", "result": {"x": 1}}},
)

# name -> (YAQL, Jinja or None when the doc lists it for YAQL only), each with its value.
EXAMPLES: Final[dict[str, tuple[tuple[str, object], tuple[str, object] | None]]] = {
    "ctx": (("<% ctx(l) %>", [3, 1, 2]), ("{{ ctx('l') }}", [3, 1, 2])),
    "result": (("<% result().stdout %>", "ok"), ("{{ result().stdout }}", "ok")),
    "succeeded": (("<% succeeded() %>", True), ("{{ succeeded() }}", True)),
    "failed": (("<% failed() %>", False), ("{{ failed() }}", False)),
    "completed": (("<% completed() %>", True), ("{{ completed() }}", True)),
    "item": (("<% item() %>", "it"), ("{{ item() }}", "it")),
    "task": (("<% task(t).result.x %>", 1), ("{{ task('t').result.x }}", 1)),
    "task_status": (("<% task_status(t) %>", "succeeded"), ("{{ task_status('t') }}", "succeeded")),
    "to_json_string": (("<% to_json_string(ctx(d)) %>", '{"a": 1}'), ("{{ to_json_string(ctx('d')) }}", '{"a": 1}')),
    "from_json_string": (("<% from_json_string(ctx(j)) %>", {"k": 1}), ("{{ from_json_string(ctx('j')) }}", {"k": 1})),
    "json_dump": (("<% json_dump(ctx(d)) %>", '{"a": 1}'), ("{{ json_dump(ctx('d')) }}", '{"a": 1}')),
    "json_parse": (("<% json_parse(ctx(j)) %>", {"k": 1}), ("{{ json_parse(ctx('j')) }}", {"k": 1})),
    "zip": (("<% zip([1, 2], [3]) %>", [[1, 3], [2, None]]), ("{{ zip([1, 2], [3]) }}", [[1, 3], [2, None]])),
    "json": (("<% json(ctx(j)) %>", {"k": 1}), ("{{ json(ctx('j')) }}", {"k": 1})),
    "json_escape": (("<% json_escape('a\"b') %>", 'a\\"b'), ("{{ json_escape('a\"b') }}", 'a\\"b')),
    "from_yaml_string": (("<% from_yaml_string('a: 1') %>", {"a": 1}), ("{{ from_yaml_string('a: 1') }}", {"a": 1})),
    "to_yaml_string": (("<% to_yaml_string(ctx(d)) %>", "a: 1\n"), ("{{ to_yaml_string(ctx('d')) }}", "a: 1\n")),
    "yaml_parse": (("<% yaml_parse('a: 1') %>", {"a": 1}), ("{{ yaml_parse('a: 1') }}", {"a": 1})),
    "yaml_dump": (("<% yaml_dump(ctx(d)) %>", "a: 1\n"), ("{{ yaml_dump(ctx('d')) }}", "a: 1\n")),
    "basename": (("<% basename(ctx(p)) %>", "y.txt"), ("{{ basename(ctx('p')) }}", "y.txt")),
    "dirname": (("<% dirname(ctx(p)) %>", "/x"), ("{{ dirname(ctx('p')) }}", "/x")),
    "use_none": (("<% use_none(1) %>", 1), ("{{ use_none(1) }}", 1)),
    # YAQL only
    "keys": (("<% keys(ctx(d)) %>", ["a"]), None),
    "values": (("<% values(ctx(d)) %>", [1]), None),
    "items": (("<% items(ctx(d)) %>", [["a", 1]]), None),
    "format": (("<% format('{0}-{h}', 1, h => 2) %>", "1-2"), None),
    "toUpper": (("<% ctx(s).toUpper() %>", "A B"), None),
    "orderBy": (("<% ctx(l).orderBy($) %>", [1, 2, 3]), None),
    "startsWith": (("<% ctx(s).startsWith('a') %>", True), None),
    "containsKey": (("<% ctx(d).containsKey(a) %>", True), None),
    "selectMany": (("<% [[1], [2]].selectMany($) %>", [1, 2]), None),
    "len": (("<% len(ctx(l)) %>", 3), None),
    "dict": (("<% dict(a => 1) %>", {"a": 1}), None),
    "list": (("<% list(1, 2) %>", [1, 2]), None),
    "range": (("<% range(3) %>", [0, 1, 2]), None),
    "str": (("<% str(1) %>", "1"), None),
    "int": (("<% int('7') %>", 7), None),
    "join": (("<% ','.join(ctx(l)) %>", "3,1,2"), None),
    "concat": (("<% concat('a', 'b') %>", "ab"), None),
    "distinct": (("<% [1, 1, 2].distinct() %>", [1, 2]), None),
    "sum": (("<% sum(ctx(l)) %>", 6), None),
    "now": (("<% now().year > 2000 %>", True), None),
}


# Names the doc quotes that are not functions: an argument, and keys of the language.
NOT_FUNCTIONS: Final = frozenset({"pad", "next", "retry", "with"})


def documented() -> tuple[set[str], set[str]]:
    """(the functions of the "both syntaxes" table, the YAQL-only ones) in docs/workflows.md."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("### Functions (both syntaxes)")
    section = text[start : text.index("\n### ", start + 1)]
    section = re.sub(r"Not provided:.*?(\n\n)", r"\1", section, flags=re.DOTALL)  # named as absent
    section = section.split("\nIn YAQL a bare name is a string")[0]
    both: set[str] = set()
    yaql_only: set[str] = set()
    for line in section.splitlines():
        spans = re.findall(r"`([^`]+)`", line)
        names = {n for span in spans for n in re.findall(r"(?<![\w$'])([A-Za-z_]\w*)\(", span)}
        names |= {span for span in spans if re.fullmatch(r"[A-Za-z_]\w*", span)} - NOT_FUNCTIONS
        (both if line.startswith("| `") else yaql_only).update(names)
    return both, yaql_only - both


def test_the_doc_lists_what_the_examples_cover() -> None:
    both, yaql_only = documented()
    assert "sum" in yaql_only  # the parsing of the doc finds something
    assert "ctx" in both
    assert both | yaql_only == set(EXAMPLES), "a documented function without an example here, or the reverse"
    assert both == {name for name, (_, jinja) in EXAMPLES.items() if jinja is not None}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_documented_function_runs(name: str) -> None:
    yaql, jinja = EXAMPLES[name]
    for expression, expected in (yaql, jinja) if jinja else (yaql,):
        assert unknown_functions(expression) == [], expression
        assert evaluate(expression, SCOPE) == expected, expression


def _problems(expression: str) -> list[str]:
    text = (
        f"ref: t.sums\ninput: [l]\ntasks:\n  total:\n    action: core.echo\n    input:\n      message: '{expression}'\n"
    )
    return [f"{p.path}: {p.message}" for p in validate(parse_workflow(text), {"core.echo"})]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("<% summ(ctx(l)) %>", "'<% summ(ctx(l)) %>': unknown function summ()"),
        ("<% ctx(l).summ() %>", "'<% ctx(l).summ() %>': unknown method .summ()"),
        ("<% toUpper(ctx(l)) %>", "'<% toUpper(ctx(l)) %>': unknown function toUpper()"),  # a method only
        ("<% let(x => nope()) -> $x %>", "unknown function nope()"),
        ("{{ nope(1) }}", "'{{ nope(1) }}': unknown function nope()"),
        ('{{ ctx("l") | nofilter }}', "unknown filter | nofilter"),
        ("{% if 1 is notatest %}x{% endif %}", "unknown test is notatest"),
    ],
)
def test_registration_names_an_unknown_function_and_its_task(expression: str, message: str) -> None:
    [problem] = _problems(expression)
    assert problem.startswith("tasks.total.input.message: expression "), problem
    assert problem.endswith(message), problem


def test_what_a_template_defines_itself_is_known() -> None:
    template = '{% macro m(x) %}{{ x }}{% endmacro %}{% set f = 1 %}{{ m(f) }}{{ ctx("l") | sum }}'
    assert _problems(template) == []


def test_a_rule_template_calling_an_unknown_function_is_refused() -> None:
    rule = "ref: r.one\ntrigger: t\naction: {ref: core.noop, parameters: {n: '<% summ(ctx(x)) %>'}}\n"
    with pytest.raises(InvalidRuleError, match=r"unknown function summ\(\)"):
        rules.load(rule)
