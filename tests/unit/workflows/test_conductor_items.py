"""The conductor: ``with`` items."""

from __future__ import annotations

import time

from conveyor.workflows.conductor import advance
from conveyor.workflows.state import ChildEnded, Dispatch, TaskRun, WorkflowState
from unit.workflows.conductor_kit import RetrySpec, Sim, WithItems, envelope, task, to, wf


def test_items_dispatch_in_index_order_up_to_concurrency_with_the_item_in_scope() -> None:
    spec = wf(task("t", with_items=WithItems("<% ctx(hosts) %>", concurrency=2), input={"host": "<% item() %>"}))
    sim = Sim(spec)
    step = sim.start(hosts=["a", "b", "c", "d"])
    assert [(c.index, c.parameters) for c in step.children] == [(0, {"host": "a"}), (1, {"host": "b"})]
    run = sim.run("t")
    assert (run.items_total, run.items, run.concurrency) == (4, ["a", "b", "c", "d"], 2)
    step = sim.finish("t", envelope("B"), index=1)
    assert [(c.index, c.parameters) for c in step.children] == [(2, {"host": "c"})]


def test_results_are_in_item_order_whatever_order_items_end() -> None:
    sim = Sim(wf(task("t", to(publish={"r": "<% result() %>"}), with_items=WithItems([10, 20, 30]))))
    sim.start()
    for index in (2, 0, 1):
        step = sim.finish("t", envelope(index * 100), index=index)
    assert step.status == "succeeded"
    assert sim.run("t").result == [0, 100, 200]
    assert step.context == {"r": [0, 100, 200]}


def test_named_items_bind_by_name() -> None:
    spec = wf(
        task("t", with_items=WithItems("<% ctx(pairs) %>", var="x, y"), input={"v": "<% item(x) %>-<% item(y) %>"})
    )
    step = Sim(spec).start(pairs=[[1, "p"], [2, "q"]])
    assert [c.parameters for c in step.children] == [{"v": "1-p"}, {"v": "2-q"}]


def test_no_concurrency_dispatches_all_items() -> None:
    step = Sim(wf(task("t", with_items=WithItems(list(range(5)))))).start()
    assert [c.index for c in step.children] == [0, 1, 2, 3, 4]


def test_concurrency_may_be_an_expression() -> None:
    step = Sim(wf(task("t", with_items=WithItems([1, 2, 3], concurrency="<% ctx(c) %>")))).start(c=1)
    assert [c.index for c in step.children] == [0]


def test_an_empty_list_succeeds_at_once_with_an_empty_result() -> None:
    sim = Sim(wf(task("t", to("next"), with_items=WithItems("<% ctx(xs) %>")), task("next")))
    step = sim.start(xs=[])
    assert (sim.run("t").status, sim.run("t").result) == ("succeeded", [])
    assert sim.names(step) == ["next"]


def test_items_that_are_not_a_list_fail_the_workflow() -> None:
    sim = Sim(wf(task("t", with_items=WithItems("<% ctx(xs) %>"))))
    step = sim.start(xs={"a": 1})
    assert step.status == "failed"
    assert step.errors[0]["where"] == "with.items"
    assert "expected a list, got dict" in step.errors[0]["message"]


def test_a_bad_concurrency_fails_the_workflow() -> None:
    step = Sim(wf(task("t", with_items=WithItems([1], concurrency="<% ctx(c) %>")))).start(c=0)
    assert step.status == "failed"
    assert "positive integer" in step.errors[0]["message"]


def test_a_failed_item_stops_new_items_lets_running_ones_finish_then_fails_the_task() -> None:
    sim = Sim(
        wf(task("t", to("h", when="<% failed() %>"), with_items=WithItems([0, 1, 2, 3, 4], concurrency=2)), task("h"))
    )
    sim.start()
    step = sim.finish("t", envelope(succeeded=False, error="bad item"), "failed", index=0)
    assert step.children == ()  # item 2 is not started
    assert sim.run("t").status == "running"  # item 1 still runs
    step = sim.finish("t", envelope("one"), index=1)
    run = sim.run("t")
    assert run.status == "failed"
    assert run.result == [{"error": "bad item", "exit_code": 1, "stdout": "", "stderr": ""}, "one", None, None, None]
    assert run.error == "1 of 5 items failed; item 0: bad item"
    assert sim.names(step) == ["h"]
    assert {d.index for d in sim.state.dispatches.values() if d.task == "t"} == {0, 1}


def test_items_are_retried_each_on_its_own() -> None:
    sim = Sim(wf(task("t", with_items=WithItems(["a", "b"]), retry=RetrySpec(count=1), input={"v": "<% item() %>"})))
    sim.start()
    step = sim.finish("t", None, "failed", index=1)
    assert [(c.index, c.retry, c.parameters) for c in step.children] == [(1, 1, {"v": "b"})]
    sim.finish("t", envelope("A"), index=0)
    step = sim.finish("t", envelope("B"), index=1)
    assert (step.status, sim.run("t").result) == ("succeeded", ["A", "B"])


def test_an_item_input_that_fails_fails_the_workflow_after_running_items() -> None:
    sim = Sim(wf(task("t", with_items=WithItems([1, 0]), input={"v": "<% 1 / item() %>"})))
    step = sim.start()
    assert [c.index for c in step.children] == [0]
    assert step.errors[0]["where"] == "input (item 1)"
    step = sim.finish("t", index=0)
    assert step.status == "failed"
    assert sim.run("t").status == "failed"


def test_ten_thousand_items_with_an_advance_per_end_stay_cheap() -> None:
    """Each advancement does one pass over the dispatches, then work proportional to the
    events: 10,000 items at concurrency 500, ended 500 per advancement, in seconds."""
    n = 10_000
    spec = wf(task("t", with_items=WithItems(list(range(n)), concurrency=500), input={"i": "<% item() %>"}))
    sim = Sim(spec)
    started = time.monotonic()
    step = sim.start()
    assert len(step.children) == 500
    while sim.status == "running":
        running = sim.running()
        step = sim.advance(*(sim.ended(e, "completed", envelope(sim.child(e).parameters["i"])) for e in running))
        assert len(step.children) <= 500
    assert time.monotonic() - started < 30
    assert sim.status == "succeeded"
    assert sim.run("t").result == list(range(n))


def test_one_child_ending_among_ten_thousand_running_is_one_dispatch_change() -> None:
    n = 10_000
    spec = wf(task("t", with_items=WithItems(list(range(n + 1)), concurrency=n)))
    dispatches = {("t", 0, i): Dispatch("t", 0, i, 1000 + i) for i in range(n)}
    run = TaskRun("t", 0, "running", items_total=n + 1, items=list(range(n + 1)), concurrency=n)
    state = WorkflowState("running", {}, {("t", 0): run}, dispatches)
    started = time.monotonic()
    for _ in range(20):
        step = advance(spec, state, [ChildEnded(1000, "t", 0, 0, "completed", None)])
    assert (time.monotonic() - started) / 20 < 0.1
    assert [d.index for d in step.dispatches] == [0]
    assert [c.index for c in step.children] == [n]
    assert step.tasks == ()


def test_retry_when_sees_the_named_item() -> None:
    spec = wf(
        task(
            "t",
            with_items=WithItems([{"h": "a"}, {"h": "b"}], var="x"),
            retry=RetrySpec(count=1, when="<% item(x).h = 'b' %>"),
        )
    )
    sim = Sim(spec)
    sim.start()
    assert sim.finish("t", None, "failed", index=0).children == ()
    assert [c.index for c in sim.finish("t", None, "failed", index=1).children] == [1]
