"""The conductor: what follows a task (``next``: when, publish, do), cycles, the end."""

from __future__ import annotations

from unit.workflows.conductor_kit import Sim, envelope, task, to, wf

OK = "<% succeeded() %>"
KO = "<% failed() %>"


def test_every_matching_transition_fires_in_order_and_publishes_into_the_context() -> None:
    spec = wf(
        task(
            "a",
            to("b", when=OK, publish={"x": "<% result().n %>", "y": "<% ctx(x) + 1 %>"}),
            to("c", when=KO),
            to("d", publish={"z": "<% ctx(y) * 10 %>"}),
        ),
        task("b"),
        task("c"),
        task("d"),
    )
    sim = Sim(spec)
    sim.start()
    step = sim.finish("a", envelope({"n": 1}))
    assert sim.names(step) == ["b", "d"]
    assert step.context == {"x": 1, "y": 2, "z": 20}
    assert sim.run("b").arrivals == ("a",)


def test_a_succeeded_task_with_no_matching_transition_is_a_leaf() -> None:
    sim = Sim(wf(task("a", to("b", when=KO)), task("b"), output=(("r", "<% task(a).result %>"),)))
    sim.start()
    step = sim.finish("a", envelope("value"))
    assert (step.status, step.output, step.errors) == ("succeeded", {"r": "value"}, ())


def test_an_unhandled_failure_fails_the_workflow_with_the_tasks_error() -> None:
    sim = Sim(wf(task("a", to("b", when=OK)), task("b")))
    sim.start()
    step = sim.finish("a", envelope(succeeded=False, error="disk full"), "failed")
    assert step.status == "failed"
    assert step.errors == ({"task": "a", "iteration": 0, "message": "disk full", "type": "task"},)
    assert sim.run("a").error == "disk full"


def test_a_failure_handled_by_a_transition_does_not_fail_the_workflow() -> None:
    sim = Sim(wf(task("a", to("cleanup", when=KO)), task("cleanup")))
    sim.start()
    step = sim.finish("a", envelope(succeeded=False, error="x"), "failed")
    assert sim.names(step) == ["cleanup"]
    assert sim.finish("cleanup").status == "succeeded"


def test_noop_handles_a_failure_and_continue_does_nothing_else() -> None:
    for command in ("noop", "continue"):
        sim = Sim(wf(task("a", to(command, when=KO))))
        sim.start()
        assert sim.finish("a", None, "failed").status == "succeeded"


def test_fail_runs_the_tasks_named_with_it_then_fails_after_running_children() -> None:
    spec = wf(task("a", to("cleanup", "fail", when=KO)), task("other"), task("cleanup", to("after")), task("after"))
    sim = Sim(spec)
    sim.start()
    step = sim.finish("a", None, "failed")
    assert sim.names(step) == ["cleanup"]  # remediation runs (Orquesta's run_on_fail)
    assert step.status is None
    assert step.errors[0]["type"] == "fail"
    step = sim.finish("cleanup")
    assert step.children == ()  # the cleanup's own next tasks do not start: the workflow is failing
    assert step.status is None  # 'other' still runs
    step = sim.finish("other")
    assert step.status == "failed"
    assert [e["type"] for e in step.errors] == ["fail"]


def test_fail_on_success_fails_the_workflow() -> None:
    sim = Sim(wf(task("a", to("fail"))))
    sim.start()
    assert sim.finish("a").status == "failed"


def test_a_failing_workflow_starts_no_new_task() -> None:
    sim = Sim(wf(task("bad"), task("slow", to("next")), task("next")))
    sim.start()
    sim.finish("bad", None, "failed")
    step = sim.finish("slow")
    assert step.children == ()
    assert step.status == "failed"
    assert sim.run("next").status == "waiting"  # reached, not started: a rerun starts it


def test_a_when_that_cannot_be_evaluated_fails_the_workflow_naming_it() -> None:
    sim = Sim(wf(task("a", to("b", when="<% result().missing.deeper %>")), task("b")))
    sim.start()
    step = sim.finish("a", envelope(None))
    assert step.status == "failed"
    assert step.errors[0]["where"] == "next[0].when"
    assert step.errors[0]["expression"] == "<% result().missing.deeper %>"


def test_a_publish_that_cannot_be_evaluated_fails_the_workflow() -> None:
    sim = Sim(wf(task("a", to("b", publish={"x": "{{ 1 / 0 }}"})), task("b")))
    sim.start()
    step = sim.finish("a")
    assert step.status == "failed"
    assert step.errors[0]["where"] == "next[0].publish.x"
    assert step.children == ()


def test_a_cycle_enters_the_task_again_as_the_next_iteration() -> None:
    spec = wf(
        task("init", to("loop", publish={"n": 0}), action=None),
        task("loop", to("loop", when="<% ctx(n) < 2 %>", publish={"n": "<% ctx(n) + 1 %>"})),
    )
    sim = Sim(spec)
    sim.start()
    for iteration in range(3):
        step = sim.finish("loop", iteration=iteration)
    assert step.status == "succeeded"
    assert sorted(k for k in sim.state.tasks if k[0] == "loop") == [("loop", 0), ("loop", 1), ("loop", 2)]
    assert step.context == {"n": 2}


def test_more_than_max_iterations_fails_the_workflow() -> None:
    sim = Sim(wf(task("init", to("loop"), action=None), task("loop", to("loop")), max_iterations=3))
    sim.start()
    for iteration in range(2):
        assert sim.finish("loop", iteration=iteration).status is None
    step = sim.finish("loop", iteration=2)
    assert step.status == "failed"
    assert "more than 3 times" in step.errors[0]["message"]
    assert ("loop", 3) not in sim.state.tasks


def test_an_actionless_cycle_is_bounded_by_max_iterations_within_one_advance() -> None:
    sim = Sim(wf(task("init", to("spin"), action=None), task("spin", to("spin"), action=None), max_iterations=50))
    step = sim.start()
    assert step.status == "failed"
    assert sum(1 for k in sim.state.tasks if k[0] == "spin") == 50


def test_the_retry_command_runs_the_task_again_as_a_new_iteration() -> None:
    sim = Sim(wf(task("a", to("retry", when="<% failed() and task(a).status = 'failed' %>"))))
    sim.start()
    step = sim.finish("a", None, "failed")
    assert [(c.task, c.iteration) for c in step.children] == [("a", 1)]
    assert sim.finish("a", iteration=1).status == "succeeded"


def test_output_is_evaluated_in_order_over_the_final_context() -> None:
    sim = Sim(
        wf(task("a", to(publish={"v": "<% result() %>"})), output=(("x", "<% ctx(v) %>"), ("y", "<% ctx(x) * 2 %>")))
    )
    sim.start()
    step = sim.finish("a", envelope(21))
    assert (step.status, step.output) == ("succeeded", {"x": 21, "y": 42})


def test_an_output_that_fails_fails_the_workflow_with_that_error() -> None:
    sim = Sim(wf(task("a"), output=(("x", "<% ctx(nope) %>"),)))
    sim.start()
    step = sim.finish("a")
    assert step.status == "failed"
    assert (step.errors[0]["where"], step.errors[0]["task"]) == ("output.x", None)
    assert step.output is None


def test_steps_carry_only_changed_rows_and_the_full_context() -> None:
    sim = Sim(wf(task("a", to("b")), task("b"), task("c"), vars=(("k", 1),)))
    sim.start()
    step = sim.finish("a")
    assert sorted(r.name for r in step.tasks) == ["a", "b"]  # c did not change
    assert [d.task for d in step.dispatches] == ["a"]  # b's row is written by its child's request
    assert step.context == {"k": 1}
