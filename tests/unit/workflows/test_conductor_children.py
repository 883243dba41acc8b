"""The conductor: children ending, what ``result()`` is, retries, duplicates."""

from __future__ import annotations

import pytest

from conveyor.workflows.childresult import child_value
from conveyor.workflows.state import ChildEnded
from unit.workflows.conductor_kit import RetrySpec, Sim, envelope, task, to, wf


def test_result_is_the_actions_return_value_not_the_runners_envelope() -> None:
    assert child_value("completed", envelope({"a": 1})) == ({"a": 1}, None)
    assert child_value("completed", envelope(0)) == (0, None)


def test_a_command_without_json_output_gives_its_output_as_stackstorm_does() -> None:
    value, _ = child_value("completed", envelope(None, stdout="hello\n"))
    assert value == {"exit_code": 0, "stdout": "hello\n", "stderr": ""}


def test_output_that_is_not_text_keeps_its_encoding_flag() -> None:
    stored = {**envelope(None, stdout="YQBi/w=="), "stdout_encoding": "base64", "stderr_encoding": "utf-8"}
    value, _ = child_value("completed", stored)
    assert value == {"exit_code": 0, "stdout": {"encoding": "base64", "data": "YQBi/w=="}, "stderr": ""}
    failed = {**envelope(succeeded=False, error="exit 1"), "stderr": "/w==", "stderr_encoding": "base64"}
    assert child_value("failed", failed)[0]["stderr"] == {"encoding": "base64", "data": "/w=="}


def test_raw_results_of_subworkflows_and_inquiries_pass_through() -> None:
    assert child_value("completed", {"answer": "yes"}) == ({"answer": "yes"}, None)
    assert child_value("completed", [1, 2]) == ([1, 2], None)


def test_a_failed_action_gives_its_error_and_output() -> None:
    value, error = child_value("failed", {**envelope(succeeded=False, error="exit 3"), "stderr": "no space"})
    assert error == "exit 3"
    assert value == {"error": "exit 3", "exit_code": 1, "stdout": "", "stderr": "no space"}


@pytest.mark.parametrize(
    ("status", "result", "error"),
    [
        ("failed", {"succeeded": False, "error": "worker lost"}, "worker lost"),
        ("timeout", envelope(succeeded=False, error="timed out after 5s"), "timed out after 5s"),
        ("abandoned", None, "the child execution ended abandoned"),
        ("failed", "plain", "plain"),
    ],
)
def test_a_failed_childs_result_carries_its_error(status: str, result: object, error: str) -> None:
    value, message = child_value(status, result)
    assert message == error
    assert value["error"] == error


def test_a_failed_subworkflow_gives_its_errors() -> None:
    errors = [{"task": "x", "message": "m1"}, {"task": "y", "message": "m2"}]
    assert child_value("failed", errors) == ({"error": "m1; m2", "errors": errors}, "m1; m2")


@pytest.mark.parametrize("status", ["failed", "timeout", "abandoned", "cancelled"])
def test_every_unsuccessful_end_fails_the_task(status: str) -> None:
    sim = Sim(wf(task("a", to("h", when="<% failed() %>")), task("h")))
    sim.start()
    step = sim.finish("a", envelope(succeeded=False, error="boom"), status)
    assert sim.run("a").status == "failed"
    assert (sim.run("a").result["error"], sim.run("a").error) == ("boom", "boom")
    assert sim.names(step) == ["h"]


def test_a_failed_child_is_retried_with_backoff_capped_by_max_delay() -> None:
    retry = RetrySpec(count=4, delay=2, backoff=3, max_delay=10)
    sim = Sim(wf(task("a", retry=retry, input={"x": 1})))
    sim.start()
    delays = []
    for n in range(4):
        step = sim.finish("a", None, "failed")
        (child,) = step.children
        assert (child.retry, child.parameters, child.iteration, child.index) == (n + 1, {"x": 1}, 0, None)
        delays.append(child.delay)
        assert sim.run("a").status == "running"
    assert delays == [2.0, 6.0, 10.0, 10.0]
    step = sim.finish("a", envelope(succeeded=False, error="last"), "failed")
    assert step.children == ()
    assert step.status == "failed"
    assert sim.state.dispatches[("a", 0, None)].retry == 4


def test_a_retry_that_succeeds_continues_the_workflow() -> None:
    sim = Sim(wf(task("a", to("b"), retry=RetrySpec(count=1)), task("b")))
    sim.start()
    sim.finish("a", None, "failed")
    step = sim.finish("a", envelope("ok"))
    assert sim.names(step) == ["b"]
    assert sim.run("a").result == "ok"


def test_retry_when_sees_the_failed_childs_result() -> None:
    retry = RetrySpec(count=5, when="<% result().error = 'transient' %>")
    sim = Sim(wf(task("a", retry=retry)))
    sim.start()
    assert sim.finish("a", {"succeeded": False, "error": "transient"}, "failed").children
    step = sim.finish("a", {"succeeded": False, "error": "fatal"}, "failed")
    assert step.children == ()
    assert step.status == "failed"


def test_retry_count_may_be_an_expression() -> None:
    sim = Sim(wf(task("a", retry=RetrySpec(count="<% ctx(n) %>")), vars=(("n", 1),)))
    sim.start()
    assert sim.finish("a", None, "failed").children
    assert sim.finish("a", None, "failed").status == "failed"


def test_retry_when_may_retry_a_success_as_orquesta_does_for_polling() -> None:
    retry = RetrySpec(count=5, when="<% succeeded() and result().state = 'pending' %>")
    sim = Sim(wf(task("poll", retry=retry)))
    sim.start()
    (child,) = sim.finish("poll", envelope({"state": "pending"})).children
    assert child.retry == 1
    step = sim.finish("poll", envelope({"state": "done"}))
    assert step.status == "succeeded"
    assert sim.run("poll").result == {"state": "done"}


def test_a_succeeded_child_is_not_retried_without_when() -> None:
    sim = Sim(wf(task("a", retry=RetrySpec(count=3))))
    sim.start()
    assert sim.finish("a").status == "succeeded"


def test_a_duplicate_child_ended_is_ignored() -> None:
    sim = Sim(wf(task("a", to("b")), task("b")))
    sim.start()
    event = sim.ended(sim.execution(("a", 0, None)))
    first = sim.advance(event)
    assert sim.names(first) == ["b"]
    again = sim.advance(event)
    assert (again.children, again.tasks, again.dispatches, again.status) == ((), (), (), None)


def test_a_duplicate_in_the_same_batch_is_ignored() -> None:
    sim = Sim(wf(task("a", to("b")), task("b")))
    sim.start()
    event = sim.ended(sim.execution(("a", 0, None)))
    step = sim.advance(event, event)
    assert sim.names(step) == ["b"]


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_the_end_of_a_replaced_child_is_ignored(status: str) -> None:
    sim = Sim(wf(task("a", retry=RetrySpec(count=3))))
    sim.start()
    old = sim.execution(("a", 0, None))
    sim.finish("a", None, "failed")
    assert sim.execution(("a", 0, None)) != old
    late = sim.advance(ChildEnded(old, "a", 0, None, status, envelope("late")))
    assert (late.tasks, late.children, late.status) == ((), (), None)
    assert sim.run("a").status == "running"


def test_a_child_of_an_unknown_dispatch_is_ignored() -> None:
    sim = Sim(wf(task("a")))
    sim.start()
    step = sim.advance(ChildEnded(999, "zzz", 0, None, "completed", None))
    assert (step.tasks, step.children, step.status) == ((), (), None)
