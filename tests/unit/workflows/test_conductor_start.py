"""The conductor: starting a workflow and starting task instances."""

from __future__ import annotations

import pytest

import conveyor.workflows._working as working
from conveyor.workflows.conductor import advance
from conveyor.workflows.state import Started, WorkflowState
from unit.workflows.conductor_kit import InputSpec, Sim, task, to, wf


def test_started_builds_context_from_parameters_defaults_and_vars_in_order() -> None:
    spec = wf(
        task("a"),
        input=(InputSpec("env"), InputSpec("region", True, "eu"), InputSpec("name", True, "<% ctx(env) %>-app")),
        vars=(("url", "https://<% ctx(name) %>.<% ctx(region) %>"), ("again", "<% ctx(url) %>/x")),
    )
    sim = Sim(spec)
    step = sim.start(env="prod", region="us")
    assert step.context == {
        "env": "prod",
        "region": "us",  # given: the default is not used
        "name": "prod-app",
        "url": "https://prod-app.us",
        "again": "https://prod-app.us/x",
    }


def test_start_tasks_are_the_ones_without_inbound_transitions_in_definition_order() -> None:
    sim = Sim(wf(task("x", to("z")), task("y", to("z")), task("z")))
    step = sim.start()
    assert sim.names(step) == ["x", "y"]
    assert [(r.name, r.status) for r in step.tasks] == [("x", "running"), ("y", "running")]
    assert step.status is None  # still running: nothing to change


def test_a_workflow_with_no_start_task_fails() -> None:
    sim = Sim(wf(task("a", to("b")), task("b", to("a"))))
    step = sim.start()
    assert step.status == "failed"
    assert "no start task" in step.errors[0]["message"]
    assert step.children == ()


def test_a_duplicate_started_does_nothing() -> None:
    sim = Sim(wf(task("a")))
    sim.start()
    again = sim.start()
    assert (again.children, again.tasks, again.status) == ((), (), None)


def test_task_input_is_evaluated_with_the_context_and_other_tasks() -> None:
    spec = wf(
        task("a", to("b", publish={"n": "<% result() %>"})),
        task("b", input={"msg": "n=<% ctx(n) %>", "prev": "<% task(a).result %>", "k": 3}),
    )
    sim = Sim(spec)
    sim.start()
    step = sim.finish("a", 7)
    assert step.children[0].parameters == {"msg": "n=7", "prev": 7, "k": 3}


def test_delay_and_timeout_go_to_the_child() -> None:
    sim = Sim(wf(task("a", delay=30, timeout=5.5)))
    child = sim.start().children[0]
    assert (child.delay, child.timeout, child.action_ref, child.index, child.retry) == (30.0, 5.5, "core.noop", None, 0)


def test_a_task_without_action_succeeds_at_once_and_its_transitions_run() -> None:
    sim = Sim(wf(task("route", to("b", publish={"x": 1}), action=None), task("b")))
    step = sim.start()
    assert sim.run("route").status == "succeeded"
    assert sim.run("route").result is None
    assert sim.names(step) == ["b"]
    assert step.context == {"x": 1}
    assert all(d.task != "route" for d in sim.state.dispatches.values())


def test_a_workflow_of_only_actionless_tasks_ends_in_one_advance() -> None:
    sim = Sim(wf(task("a", to("b"), action=None), task("b", action=None), output=(("done", True),)))
    step = sim.start()
    assert (step.status, step.output) == ("succeeded", {"done": True})


def test_an_input_expression_that_fails_fails_the_workflow_naming_task_and_expression() -> None:
    sim = Sim(wf(task("a", input={"x": "<% ctx(nope) %>"})))
    step = sim.start()
    assert step.status == "failed"
    (error,) = step.errors
    assert (error["task"], error["iteration"], error["expression"], error["where"]) == (
        "a",
        0,
        "<% ctx(nope) %>",
        "input",
    )
    assert "nope" in error["message"]
    assert sim.run("a").status == "failed"


def test_a_failing_default_or_var_fails_the_workflow_before_any_task() -> None:
    sim = Sim(wf(task("a"), vars=(("v", "<% 1 / 0 %>"),)))
    step = sim.start()
    assert step.status == "failed"
    assert step.errors[0]["task"] is None
    assert step.errors[0]["where"] == "vars.v"
    assert step.children == ()


def test_an_expression_failure_waits_for_the_running_children_then_fails() -> None:
    sim = Sim(wf(task("ok"), task("bad", input={"x": "<% ctx(nope) %>"})))
    step = sim.start()
    assert step.status is None  # 'ok' still runs
    assert step.errors  # failing: the error is stored now
    assert sim.names(step) == ["ok"]
    step = sim.finish("ok")
    assert step.status == "failed"


def test_advance_never_raises_on_an_evaluator_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(value: object, scope: object, *limits: object) -> object:
        raise RuntimeError("bug")

    monkeypatch.setattr(working, "evaluate", broken)
    step = advance(wf(task("a", input={"x": "<% 1 %>"})), WorkflowState("running", {}), [Started({})])
    assert step.status == "failed"
    assert "RuntimeError: bug" in step.errors[0]["message"]
