"""Rule documents: StackStorm's shape accepted, every problem listed with its path,
templates rendered from the event."""

from __future__ import annotations

import json

import pytest

from conveyor.domain.errors import InvalidRuleError
from conveyor.rules import criteria as c
from conveyor.rules import parse
from conveyor.rules.render import EventRow, RuleRow, decide

ST2 = """
name: on_push
pack: ci
description: deploy main
enabled: false
tags: [x]
trigger:
  type: github.push
  parameters: {}
criteria:
  trigger.body.ref:
    type: equals
    pattern: refs/heads/main
action:
  ref: ops.deploy
  parameters:
    sha: "{{ trigger.body.after }}"
    who: "<% $.trigger.body.pusher.name %>"
"""


def test_a_stackstorm_rule_loads() -> None:
    spec = parse.load(ST2)
    assert (spec.ref, spec.trigger, spec.action_ref, spec.enabled) == ("ci.on_push", "github.push", "ops.deploy", False)
    assert spec.definition["tags"] == ["x"]


def test_json_is_accepted() -> None:
    spec = parse.load('{"ref": "a.b", "trigger": "t", "action": {"ref": "core.noop"}}')
    assert spec.enabled is True
    assert spec.parameters == {}
    assert spec.criteria == {}


def test_every_problem_with_its_path() -> None:
    with pytest.raises(InvalidRuleError) as caught:
        parse.load(
            "ref: 'no spaces'\ntrigger: {}\ncolour: red\nenabled: maybe\n"
            "criteria: {trigger.a: {type: regex, pattern: '['}}\n"
            "action: {ref: x.y, extra: 1, parameters: {a: '{{ 1 +  }}', b: '<% $.x %'}}\n",
            "rules/bad.yaml",
        )
    paths = [path for _, path, _ in caught.value.problems]
    assert paths == ["colour", "ref", "trigger.type", "criteria.trigger.a.pattern", "action.extra",
                     "action.parameters.a", "action.parameters.b", "enabled"]  # fmt: skip
    assert all(where == "rules/bad.yaml" for where, _, _ in caught.value.problems)
    assert "rules/bad.yaml: colour: unknown key" in caught.value.lines()


@pytest.mark.parametrize("text", ["", "[1, 2]", "a: [", "just text", "ref: a.b\naction: 3"])
def test_not_a_rule(text: str) -> None:
    with pytest.raises(InvalidRuleError):
        parse.load(text)


def test_several_files_all_or_none() -> None:
    ok = "ref: a.b\ntrigger: t\naction: {ref: core.noop}"
    with pytest.raises(InvalidRuleError) as caught:
        parse.all_or_problems([lambda: parse.load(ok, "1"), lambda: parse.load(ok, "2"), lambda: parse.load("x", "3")])
    assert [where for where, _, _ in caught.value.problems] == ["3", ""]


def test_decide() -> None:
    spec = parse.load(ST2)
    rule = RuleRow(1, spec.ref, spec.criteria, spec.action_ref, spec.parameters, True)
    push = {"body": {"ref": "refs/heads/main", "after": "abc", "pusher": {"name": "ann"}}}
    decision = decide(rule, EventRow(9, "github.push", push, "webhook", "2026-01-01T00:00:00+00:00"))
    assert decision is not None
    assert decision.outcome == "requested"
    assert decision.parameters == {"sha": "abc", "who": "ann"}
    assert decide(rule, EventRow(9, "github.push", {"body": {"ref": "x"}}, "webhook", "")) is None
    off = RuleRow(1, spec.ref, spec.criteria, spec.action_ref, spec.parameters, False)
    assert decide(off, EventRow(9, "github.push", push, "webhook", "")).outcome == "rule_disabled"  # type: ignore[union-attr]
    broken = decide(rule, EventRow(9, "github.push", {"body": {"ref": "refs/heads/main"}}, "webhook", ""))
    assert broken is not None
    assert broken.outcome == "template_error"
    assert broken.error
    raw = RuleRow(1, "r", {"trigger.a": {"type": "bogus"}}, "x", {}, True)
    assert decide(raw, EventRow(9, "t", {}, "sql", "")).outcome == "template_error"  # type: ignore[union-attr]


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(InvalidRuleError, match="not valid Unicode"):
        parse.load(b'{"ref": "a.b", "description": "\\ud800", "trigger": "t", "action": {"ref": "x.y"}}')


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("trigger.headers['x-github-event']", ("headers", "x-github-event")),
        ('trigger.body["a.b"].c', ("body", "a.b", "c")),
        ("trigger.body.commits[0].id", ("body", "commits", "0", "id")),
        ("trigger.headers.x-github-event", ("headers", "x-github-event")),
    ],
)
def test_bracketed_keys_reach_hyphenated_and_dotted_keys(key: str, path: tuple[str, ...]) -> None:
    doc = {"ref": "a.b", "trigger": "t", "action": {"ref": "x.y"}, "criteria": {key: {"type": "exists"}}}
    check = parse.criteria_of(parse.parse(doc).criteria)
    assert isinstance(check, c.Check)
    assert check.path == path
    payload = {"headers": {"x-github-event": "push"}, "body": {"a.b": {"c": 1}, "commits": [{"id": 7}]}}
    assert c.matches(check, payload)


@pytest.mark.parametrize(
    "key", ["trigger.headers['x", "trigger.a[b]", "trigger..a", "trigger.", "triggers.a", "body.x"]
)
def test_malformed_paths_are_refused(key: str) -> None:
    doc = {"ref": "a.b", "trigger": "t", "action": {"ref": "x.y"}, "criteria": {key: {"type": "exists"}}}
    with pytest.raises(InvalidRuleError, match="a criteria key is a path"):
        parse.parse(doc)


@pytest.mark.parametrize(("field", "value"), [("ref", "a.b\n"), ("trigger", "t\n")])
def test_a_final_newline_is_not_a_name(field: str, value: str) -> None:
    """``re.match`` with ``$`` accepts a final newline; the database's CHECK did not, so
    such a rule got as far as the INSERT (a 500 from the API). Refused here, with its path."""
    rule = {"ref": "a.b", "trigger": "t", "action": {"ref": "core.noop"}}
    rule[field] = value
    with pytest.raises(InvalidRuleError) as caught:
        parse.load(json.dumps(rule))
    assert [path for _, path, _ in caught.value.problems] == [field]
