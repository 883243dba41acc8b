"""Attune's legacy transitions, and registration-time validation with paths."""

from __future__ import annotations

import pytest

from conveyor.workflows.parse import Problem, WorkflowError, parse_workflow
from conveyor.workflows.spec import Transition
from conveyor.workflows.validate import validate

KNOWN = {"core.noop", "core.echo", "core.local"}


def test_legacy_keys_become_next_transitions_in_order() -> None:
    text = """
tasks:
  a:
    action: core.noop
    on_complete: [audit]
    on_failure: cleanup
    on_success:
      do: b, c
      publish: {out: <% result() %>}
  b: {action: core.noop, on_success: [d]}
  c: {action: core.noop, on_success: {next: d, publish: [{x: 1}]}}
  d: {action: core.noop, join: all}
  audit: {action: core.noop}
  cleanup: {action: core.noop}
"""
    spec = parse_workflow(text, ref="legacy.wf")
    assert spec.tasks["a"].next == (
        Transition("<% succeeded() %>", (("out", "<% result() %>"),), ("b", "c")),
        Transition("<% failed() %>", (), ("cleanup",)),
        Transition(None, (), ("audit",)),
    )
    assert spec.tasks["b"].next == (Transition("<% succeeded() %>", (), ("d",)),)
    assert spec.tasks["c"].next == (Transition("<% succeeded() %>", (("x", 1),), ("d",)),)
    assert validate(spec, KNOWN) == []


def test_legacy_and_next_in_one_task_is_a_problem() -> None:
    with pytest.raises(WorkflowError) as caught:
        parse_workflow("tasks:\n  a: {on_success: b, next: [{do: b}]}\n  b: {}", ref="t.wf")
    assert caught.value.problems == [
        Problem("tasks.a.next", "cannot be mixed with the legacy on_success: use one or the other")
    ]


def test_legacy_shape_problems_have_paths() -> None:
    with pytest.raises(WorkflowError) as caught:
        parse_workflow("tasks:\n  a: {on_success: 3, on_failure: {do: b, go: c, publish: 4}}\n  b: {}", ref="t.wf")
    assert [p.path for p in caught.value.problems] == [
        "tasks.a.on_success",
        "tasks.a.on_failure.go",
        "tasks.a.on_failure.publish",
    ]


def _validate(text: str, known: set[str] = KNOWN) -> list[Problem]:
    return validate(parse_workflow(text, ref="t.wf"), known)


def test_a_correct_workflow_has_no_problems() -> None:
    text = """
input: [xs, {n: <% 1 + 1 %>}]
vars: [{v: "{{ ctx('n') }}"}]
tasks:
  a:
    action: core.echo message=<% ctx(n) %>
    next: [{when: <% succeeded() %>, do: [b, c]}, {when: <% failed() %>, do: fail}]
  b: {action: core.noop, next: [{do: d}]}
  c: {action: t.wf, with: {items: <% ctx(xs) %>, concurrency: 2}, next: [{do: d}]}
  d: {join: 2, next: [{when: <% ctx(v) < 3 %>, do: b}]}
output: [{o: <% ctx(v) %>}]
"""
    assert _validate(text, {*KNOWN, "t.wf"}) == []


def test_every_problem_is_listed_with_its_path() -> None:
    text = """
input: [{n: <% 1 + %>}]
vars: [{v: "{{ ctx('n' }}"}]
tasks:
  start:
    action: ops.missing
    input: {m: "<% ctx(", ok: "<% ctx(a) %>"}
    next:
      - when: <% succeeded( %>
        publish: [{p: "{{ }}"}]
        do: [b, nowhere, noop]
  b:
    action: t.wf
    join: all
    with: {items: "<% ctx(xs %>", concurrency: 0}
    retry: {count: -1, delay: -2, when: "<% x y %>", backoff: 0.5}
  island: {action: core.noop, next: [{do: island2}]}
  island2: {action: core.noop, next: [{do: island}]}
output: [{o: "{% if %}"}]
"""
    problems = _validate(text)
    paths = [p.path for p in problems]
    assert paths == [
        "vars[0].v",
        "output[0].o",
        "input[0].n",
        "tasks.start.action",
        "tasks.start.input.m",
        "tasks.start.next[0].when",
        "tasks.start.next[0].publish[0].p",
        "tasks.start.next[0].do",
        "tasks.b.action",
        "tasks.b.with.items",
        "tasks.b.with.concurrency",
        "tasks.b.retry.count",
        "tasks.b.retry.when",
        "tasks.b.retry.delay",
        "tasks.b.retry.backoff",
        "tasks.island",
        "tasks.island2",
        "tasks.b.join",
    ]
    messages = {p.path: p.message for p in problems}
    assert messages["tasks.start.action"] == "unknown action 'ops.missing'"
    assert messages["tasks.b.action"] == "unknown action 't.wf'"  # its own ref, not registered yet
    assert messages["tasks.start.next[0].do"] == "unknown task 'nowhere'"
    assert messages["tasks.start.input.m"].startswith("expression syntax error: '<% ctx(': <% is not closed")
    assert messages["tasks.island"] == "unreachable: no path leads here from a start task"
    assert messages["tasks.b.join"] == "a join needs two or more inbound transitions; this task has 1"
    assert messages["tasks.b.with.concurrency"] == "must be at least 1"
    assert messages["tasks.b.retry.count"] == "must not be negative"


def test_no_tasks_and_no_start_task() -> None:
    assert _validate("tasks: {}") == [Problem("tasks", "a workflow needs at least one task")]
    assert _validate("tasks:\n  a: {next: [{do: b}]}\n  b: {next: [{do: a}]}") == [
        Problem("tasks", "no task to start with: every task has an inbound transition")
    ]


def test_join_n_larger_than_the_inbound_transitions() -> None:
    text = "tasks:\n  a: {next: [{do: [b, c]}]}\n  b: {next: [{do: d}]}\n  c: {next: [{do: d}]}\n  d: {join: 3}"
    assert _validate(text) == [Problem("tasks.d.join", "joins 3 inbound transitions but the task has only 2")]


def test_literal_with_items_text_is_a_problem() -> None:
    assert _validate("tasks:\n  a: {action: core.noop, with: {items: 'a, b'}}") == [
        Problem("tasks.a.with.items", "must be a list or an expression")
    ]
