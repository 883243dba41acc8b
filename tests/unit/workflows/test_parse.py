"""Reading YAML workflows (Orquesta's language) into the model, and its problems with paths."""

from __future__ import annotations

import re

import pytest
import yaml

from conveyor.workflows.parse import Problem, WorkflowError, parse_workflow
from conveyor.workflows.spec import InputSpec, RetrySpec, Transition, WithItems, WorkflowSpec

# Written like StackStorm's examples: sequential with publish, parallel with a join,
# with-items (named, zipped, concurrency), retry, the shorthand action, both syntaxes.
ORQUESTA_EXAMPLE = """
version: 1.0
description: Deploy to every host, then notify.
input:
  - hosts
  - message: "deployed"
vars:
  - attempts: 0
tasks:
  build:
    action: core.local cmd="make build" timeout=60
    next:
      - when: <% succeeded() %>
        publish:
          - artifact: <% result().stdout %>
        do: unit, lint
      - when: <% failed() %>
        do: fail
  unit:
    action: core.local
    input:
      cmd: make test
    next:
      - when: "{{ succeeded() }}"
        do:
          - deploy
  lint:
    action: core.local cmd="make lint"
    retry:
      when: <% failed() %>
      count: 2
      delay: 5
    next:
      - do: deploy
  deploy:
    join: all
    with:
      items: host in <% ctx(hosts) %>
      concurrency: 2
    action: core.remote hosts=<% item(host) %> cmd="deploy <% ctx(artifact) %>"
    next:
      - when: <% succeeded() %>
        publish: deployed=<% result() %>
        do: notify
  notify:
    with: x, y in <% zip(ctx(hosts), ctx(hosts)) %>
    action: core.echo message="{{ item('x') }} {{ ctx('message') }}"
    timeout: 30
output:
  - deployed: <% ctx(deployed) %>
"""


def test_an_orquesta_workflow_parses() -> None:
    spec = parse_workflow(ORQUESTA_EXAMPLE, ref="examples.deploy")
    assert spec.ref == "examples.deploy"
    assert spec.version == "1.0"
    assert spec.input == (InputSpec("hosts"), InputSpec("message", True, "deployed"))
    assert spec.parameters_schema == {
        "type": "object",
        "properties": {"hosts": {}, "message": {}},
        "required": ["hosts"],
        "additionalProperties": False,
    }
    assert spec.vars == (("attempts", 0),)
    assert list(spec.tasks) == ["build", "unit", "lint", "deploy", "notify"]
    build = spec.tasks["build"]
    assert build.action == "core.local"
    assert build.input == {"cmd": "make build", "timeout": 60}
    assert build.next == (
        Transition("<% succeeded() %>", (("artifact", "<% result().stdout %>"),), ("unit", "lint")),
        Transition("<% failed() %>", (), ("fail",)),
    )
    assert spec.tasks["unit"].next == (Transition("{{ succeeded() }}", (), ("deploy",)),)
    assert spec.tasks["lint"].retry == RetrySpec(count=2, when="<% failed() %>", delay=5.0)
    deploy = spec.tasks["deploy"]
    assert deploy.join == "all"
    assert deploy.with_items == WithItems("<% ctx(hosts) %>", "host", 2)
    assert deploy.input == {"hosts": "<% item(host) %>", "cmd": "deploy <% ctx(artifact) %>"}
    assert deploy.next[0].publish == (("deployed", "<% result() %>"),)
    notify = spec.tasks["notify"]
    assert notify.with_items == WithItems("<% zip(ctx(hosts), ctx(hosts)) %>", "x, y", None)
    assert notify.timeout == 30.0
    assert spec.output == (("deployed", "<% ctx(deployed) %>"),)
    assert spec.starts() == ["build"]
    assert WorkflowSpec.from_json(spec.to_json()) == spec


def test_ref_comes_from_the_file_and_the_argument_overrides_it() -> None:
    text = "ref: ops.one\ntasks: {a: {action: core.noop}}"
    assert parse_workflow(text).ref == "ops.one"
    assert parse_workflow(text, ref="ops.two").ref == "ops.two"


def _problems(text: str, ref: str | None = "t.wf") -> list[Problem]:
    with pytest.raises(WorkflowError) as caught:
        parse_workflow(text, ref=ref)
    assert str(caught.value)  # one line naming them all
    return caught.value.problems


def test_a_file_without_ref_and_no_argument_is_a_problem() -> None:
    assert _problems("tasks: {a: {action: core.noop}}", ref=None) == [
        Problem("ref", "no ref: the file has no `ref:` and none was given (--ref)")
    ]


def test_yaml_syntax_errors_name_line_and_column() -> None:
    [problem] = _problems("tasks:\n  a: [1,\n  b")
    assert problem.path == ""
    # Where the parser gave up (libyaml: the end of the text, line 4 column 1; PyYAML's own
    # parser: line 3 column 4), and where the unclosed construct starts (both parsers).
    assert re.match(r"YAML syntax error at line \d+, column \d+: .*expected ',' or '\]'", problem.message)
    assert problem.message.endswith("(while parsing a flow sequence at line 2, column 6)")


def test_yaml_objects_are_not_constructed() -> None:
    [problem] = _problems("tasks: !!python/object/apply:os.system ['true']")
    assert "YAML syntax error" in problem.message


def test_every_problem_is_listed_with_its_path() -> None:
    text = """
bogus: 1
input: [ok, {a: 1, b: 2}]
tasks:
  a:
    action: not-a-ref
    colour: red
    next:
      - do: 3
        whenever: x
      - when: 5
    with: {items: 3, concurrency: true, extra: 1}
    join: 0
    retry: {count: x1, delay: soon, tries: 3}
    timeout: -1
  noop: {action: core.noop}
  b: [1]
"""
    paths = {(p.path, p.message.split(" (")[0]) for p in _problems(text)}
    assert paths == {
        ("bogus", "unknown key"),
        ("input[1]", "must be a name or {name: default}"),
        ("tasks.a.action", "'not-a-ref' is not an action ref"),
        ("tasks.a.colour", "unknown key"),
        ("tasks.a.next[0].do", "must be a task name, a list of them, or 'a, b'"),
        ("tasks.a.next[0].whenever", "unknown key"),
        ("tasks.a.next[1].when", "must be an expression"),
        ("tasks.a.with.items", "must be a list or an expression"),
        ("tasks.a.with.concurrency", "must be a number or an expression"),
        ("tasks.a.with.extra", "unknown key"),
        ("tasks.a.join", "must be `all` or a number of inbound transitions"),
        ("tasks.a.retry.tries", "unknown key"),
        ("tasks.a.retry.delay", "must be a number, not text"),
        ("tasks.a.timeout", "must not be negative"),
        ("tasks.noop", "'noop' is a command of `do`; a task cannot have that name"),
        ("tasks.b", "a task must be a mapping, not a list"),
    }


def test_the_retry_count_may_be_an_expression() -> None:
    spec = parse_workflow("tasks: {a: {action: core.noop, retry: {count: '<% ctx(n) %>'}}}", ref="t.wf")
    assert spec.tasks["a"].retry == RetrySpec(count="<% ctx(n) %>")


def test_with_shorthand_string_and_literal_list() -> None:
    spec = parse_workflow(
        "tasks:\n  a: {action: core.noop, with: <% ctx(xs) %>}\n  b: {action: core.noop, with: {items: [1, 2]}}",
        ref="t.wf",
    )
    assert spec.tasks["a"].with_items == WithItems("<% ctx(xs) %>")
    assert spec.tasks["b"].with_items == WithItems([1, 2])


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ('core.echo message="hello <% ctx(x) %>" n=3', {"message": "hello <% ctx(x) %>", "n": 3}),
        ("core.echo a=true b=null c=1.5 d=text", {"a": True, "b": None, "c": 1.5, "d": "text"}),
        ("core.echo m=<% ctx(a) + ' ' + ctx(b) %>", {"m": "<% ctx(a) + ' ' + ctx(b) %>"}),
        ('core.echo m=\'it\\\'s "quoted"\' n="3"', {"m": 'it\'s "quoted"', "n": "3"}),
        ("core.echo l=[1,2]", {"l": "[1,2]"}),
        # Backslashes are kept as written (Orquesta keeps them); only an escaped quote
        # loses its backslash, and a doubled one is kept whole (so it may end a value).
        ("core.echo cmd='printf \"x\\ty\\n\"'", {"cmd": 'printf "x\\ty\\n"'}),
        ('core.echo p="C:\\temp\\new" q=\'C:\\\\\' r="a\\"b"', {"p": "C:\\temp\\new", "q": "C:\\\\", "r": 'a"b'}),
    ],
)
def test_action_shorthand(action: str, expected: dict[str, object]) -> None:
    spec = parse_workflow(yaml.safe_dump({"tasks": {"a": {"action": action}}}), ref="t.wf")
    assert spec.tasks["a"].action == "core.echo"
    assert spec.tasks["a"].input == expected


def test_action_shorthand_problems() -> None:
    problems = _problems(
        "tasks:\n  a: {action: 'core.echo m=\"open', input: {}}\n  b: {action: core.echo n=1, input: {n: 2}}"
    )
    assert [p.path for p in problems] == ["tasks.a.action", "tasks.b.input.n"]
    assert problems[0].message.startswith("unterminated quote")
    assert problems[1].message == "given both inline in `action` and in `input`"


def test_explicit_parameters_schema_is_kept_and_checked() -> None:
    good = "parameters: {type: object, properties: {n: {type: integer}}}\ntasks: {a: {action: core.noop}}"
    assert parse_workflow(good, ref="t.wf").parameters_schema["properties"] == {"n": {"type": "integer"}}
    [problem] = _problems("parameters: {type: 3}\ntasks: {a: {action: core.noop}}")
    assert problem.path == "parameters.type"
    assert "not a valid JSON Schema" in problem.message


def test_vars_and_output_accept_a_mapping_and_publish_a_mapping() -> None:
    spec = parse_workflow(
        "vars: {a: 1}\noutput: {o: <% ctx(a) %>}\ntasks:\n  t:\n    next: [{publish: {p: 1, q: 2}, do: u}]\n  u: {}",
        ref="t.wf",
    )
    assert spec.vars == (("a", 1),)
    assert spec.output == (("o", "<% ctx(a) %>"),)
    assert spec.tasks["t"].next[0].publish == (("p", 1), ("q", 2))
    assert spec.tasks["t"].action is None


def test_a_task_name_with_a_final_newline_is_refused() -> None:
    """``re.match`` with ``$`` accepts a final newline (a 500 at the INSERT before)."""
    with pytest.raises(WorkflowError):
        parse_workflow(yaml.safe_dump({"tasks": {"a\n": {"action": "core.noop"}}}), ref="t.wf")


def test_a_workflow_ref_with_a_final_newline_is_refused() -> None:
    with pytest.raises(WorkflowError):
        parse_workflow(yaml.safe_dump({"tasks": {"a": {"action": "core.noop"}}}), ref="t.wf\n")
