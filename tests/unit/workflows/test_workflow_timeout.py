"""The workflow-level ``timeout``: parsed, validated, stored, and named when it fires."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.workflows.builder import Workflow
from conveyor.workflows.parse import WorkflowError, parse_workflow
from conveyor.workflows.spec import WorkflowSpec
from conveyor.workflows.state import TimedOut
from conveyor.workflows.validate import validate
from unit.workflows.conductor_kit import Sim, task, wf

TEXT = """
ref: ops.slow
timeout: 2.5
tasks:
  a: {action: core.noop, timeout: 1}
"""


def test_timeout_is_parsed_and_stored_at_the_top_of_the_definition() -> None:
    spec = parse_workflow(TEXT)
    assert spec.timeout == 2.5
    stored = spec.to_json()
    # start_workflows (migration 0013) reads definition->>'timeout' for the deadline.
    assert stored["timeout"] == 2.5
    assert WorkflowSpec.from_json(stored) == spec


def test_no_timeout_is_none_and_old_stored_definitions_read_as_none() -> None:
    spec = parse_workflow("ref: ops.x\ntasks: {a: {action: core.noop}}")
    assert spec.timeout is None
    stored = spec.to_json()
    assert stored["timeout"] is None
    del stored["timeout"]  # stored before the field existed
    assert WorkflowSpec.from_json(stored).timeout is None


@pytest.mark.parametrize(("value", "message"), [("-1", "must not be negative"), ("soon", "must be a number, not text")])
def test_a_bad_timeout_is_a_problem_with_its_path(value: str, message: str) -> None:
    with pytest.raises(WorkflowError) as caught:
        parse_workflow(f"ref: ops.x\ntimeout: {value}\ntasks: {{a: {{action: core.noop}}}}")
    assert [(p.path, p.message) for p in caught.value.problems] == [("timeout", message)]


def test_validate_refuses_a_negative_timeout_from_any_source() -> None:
    spec = replace(parse_workflow(TEXT), timeout=-3.0)
    assert [(p.path, p.message) for p in validate(spec, {"core.noop"})] == [("timeout", "must not be negative")]
    assert validate(parse_workflow(TEXT), {"core.noop"}) == []


def test_the_builder_takes_a_timeout() -> None:
    built = Workflow("ops.built", timeout=30)
    built.task("a", "core.noop")
    assert built.spec().timeout == 30


def test_the_timeout_error_names_the_workflow_and_its_limit() -> None:
    sim = Sim(wf(task("a"), timeout=2.0))
    step = sim.advance(TimedOut())
    assert step.status == "failed"
    [error] = step.errors
    assert error["type"] == "timeout"
    assert error["timeout"] == 2.0
    assert "timed out after 2 s" in error["message"]
    assert "test.wf" in error["message"]
