"""The conductor: cancel, pause and resume, timeouts, rerun."""

from __future__ import annotations

from conveyor.workflows.state import CancelRequested, PauseRequested, Rerun, ResumeRequested, Started, TimedOut
from unit.workflows.conductor_kit import RetrySpec, Sim, WithItems, envelope, task, to, wf


def two_branches() -> Sim:
    sim = Sim(wf(task("a", to("after_a")), task("b", to("after_b")), task("after_a"), task("after_b")))
    sim.start()
    return sim


def test_cancel_allow_finish_lets_children_finish_starts_nothing_then_cancels() -> None:
    sim = two_branches()
    step = sim.advance(CancelRequested())
    assert (step.status, step.cancel) == ("canceling", ())
    step = sim.finish("a")
    assert (step.children, step.status) == ((), None)
    assert sim.run("a").status == "succeeded"
    step = sim.finish("b", None, "failed")
    assert step.status == "cancelled"
    assert step.errors == ()  # a failure while cancelling is not a workflow failure


def test_cancel_running_cancels_the_running_children_and_ends_when_they_ended() -> None:
    sim = two_branches()
    a, b = sim.running()
    step = sim.advance(CancelRequested("cancel_running"))
    assert (step.status, step.cancel) == ("canceling", (a, b))
    step = sim.end(a, "cancelled")
    assert step.status is None
    assert sim.run("a").status == "cancelled"
    step = sim.end(b, "cancelled")
    assert step.status == "cancelled"
    assert step.children == ()


def test_children_cancelled_by_the_cancel_are_not_retried_and_trigger_no_transition() -> None:
    sim = Sim(wf(task("a", to("h", when="<% failed() %>"), retry=RetrySpec(count=3)), task("h")))
    sim.start()
    sim.advance(CancelRequested("cancel_running"))
    step = sim.finish("a", None, "cancelled")
    assert (step.children, step.status) == ((), "cancelled")


def test_a_cancel_behind_pending_events_drops_what_they_would_dispatch() -> None:
    """A sub-workflow whose advancement was pending when its ancestor's cancel reached it
    (migration 0032 queues a 'cancel' event behind its events): one advancement applies
    them all and requests nothing -- not the start tasks, not a transition, not a retry."""
    spec = wf(task("a", to("b"), retry=RetrySpec(count=3)), task("b"))
    for cancel in (CancelRequested("allow_finish"), CancelRequested("cancel_running")):
        sim = Sim(spec)
        step = sim.advance(Started({}), cancel)
        assert (step.children, step.status) == ((), "cancelled")
    for status in ("completed", "failed"):  # a transition, a retry
        sim = Sim(spec)
        sim.start()
        (a,) = sim.running()
        step = sim.advance(sim.ended(a, status), CancelRequested())
        assert (step.children, step.status) == ((), "cancelled")


def test_cancel_with_nothing_running_cancels_at_once() -> None:
    sim = Sim(wf(task("a")))
    sim.start()
    sim.advance(PauseRequested())
    sim.finish("a")
    assert sim.status == "paused"
    assert sim.advance(CancelRequested()).status == "cancelled"


def test_an_ended_workflow_ignores_cancel_pause_and_children() -> None:
    sim = Sim(wf(task("a")))
    sim.start()
    sim.finish("a")
    for event in (CancelRequested(), PauseRequested(), ResumeRequested(), TimedOut()):
        step = sim.advance(event)
        assert (step.status, step.tasks, step.children) == (None, (), ())


def test_pause_stops_new_children_and_resume_starts_what_was_deferred() -> None:
    sim = Sim(wf(task("a", to("b")), task("b")))
    sim.start()
    assert sim.advance(PauseRequested()).status == "paused"
    step = sim.finish("a")
    assert step.children == ()
    assert sim.run("b").status == "waiting"
    assert sim.status == "paused"  # nothing runs, yet not ended
    step = sim.advance(ResumeRequested())
    assert (step.status, sim.names(step)) == ("running", ["b"])
    assert sim.finish("b").status == "succeeded"


def test_pause_defers_next_items_and_resume_tops_up_to_concurrency() -> None:
    sim = Sim(wf(task("t", with_items=WithItems([0, 1, 2, 3], concurrency=2))))
    sim.start()
    sim.advance(PauseRequested())
    assert sim.finish("t", index=0).children == ()
    assert sim.finish("t", index=1).children == ()
    step = sim.advance(ResumeRequested())
    assert [c.index for c in step.children] == [2, 3]


def test_pause_defers_a_retry_to_resume() -> None:
    sim = Sim(wf(task("a", retry=RetrySpec(count=2, delay=4, backoff=2))))
    sim.start()
    sim.advance(PauseRequested())
    step = sim.finish("a", None, "failed")
    assert step.children == ()
    (d,) = step.dispatches
    assert (d.execution, d.retry, d.status) == (None, 1, "running")
    step = sim.advance(ResumeRequested())
    (child,) = step.children
    assert (child.retry, child.delay) == (1, 4.0)
    assert sim.finish("a").status == "succeeded"


def test_cancel_while_paused_drops_deferred_work() -> None:
    sim = Sim(wf(task("a", retry=RetrySpec(count=2))))
    sim.start()
    sim.advance(PauseRequested())
    sim.finish("a", None, "failed")
    step = sim.advance(CancelRequested())
    assert step.status == "cancelled"
    assert sim.state.dispatches[("a", 0, None)].status == "cancelled"
    assert sim.run("a").status == "cancelled"


def test_a_workflow_timeout_cancels_running_children_and_fails_now() -> None:
    sim = two_branches()
    a, b = sim.running()
    step = sim.advance(TimedOut())
    assert (step.status, step.cancel) == ("failed", (a, b))
    assert step.errors[0]["type"] == "timeout"
    assert {sim.run("a").status, sim.run("b").status} == {"cancelled"}
    late = sim.end(a, "cancelled")
    assert (late.status, late.tasks, late.children) == (None, (), ())


def test_a_task_timeout_fails_the_task_without_retry_and_runs_its_failure_transitions() -> None:
    sim = Sim(wf(task("a", to("h", when="<% failed() %>"), retry=RetrySpec(count=5)), task("h")))
    sim.start()
    (a,) = sim.running()
    step = sim.advance(TimedOut("a", 0))
    assert step.cancel == (a,)
    assert (sim.run("a").status, sim.run("a").error) == ("failed", "task 'a' timed out")
    assert sim.names(step) == ["h"]
    late = sim.end(a, "cancelled")
    assert (late.tasks, late.children) == ((), ())


def test_a_with_task_timeout_cancels_all_its_running_items() -> None:
    sim = Sim(wf(task("t", with_items=WithItems([0, 1, 2], concurrency=2))))
    sim.start()
    sim.finish("t", envelope("zero"), index=0)
    running = sim.running()
    step = sim.advance(TimedOut("t", 0))
    assert step.cancel == tuple(running)
    assert step.status == "failed"
    assert sim.run("t").result == ["zero", None, None]


def test_a_timeout_for_an_ended_task_is_ignored() -> None:
    sim = Sim(wf(task("a"), task("b")))
    sim.start()
    sim.finish("a")
    step = sim.advance(TimedOut("a", 0))
    assert (step.tasks, step.cancel, step.status) == ((), (), None)


def test_rerun_starts_the_failed_tasks_again_keeping_what_completed() -> None:
    sim = Sim(wf(task("ok", to("after", publish={"v": "<% result() %>"})), task("flaky"), task("after")))
    sim.start()
    sim.finish("ok", envelope(5))
    sim.finish("after")
    step = sim.finish("flaky", None, "failed")
    assert step.status == "failed"
    step = sim.advance(Rerun((("flaky", 0),)))
    assert (step.status, step.errors) == ("running", ())
    assert [(c.task, c.iteration) for c in step.children] == [("flaky", 1)]
    assert step.context == {"v": 5}
    assert sim.run("ok").status == "succeeded"
    assert sim.finish("flaky", iteration=1).status == "succeeded"


def test_rerun_of_nothing_failed_fails_again_saying_so() -> None:
    sim = Sim(wf(task("a")))
    sim.start()
    sim.finish("a", None, "failed")
    step = sim.advance(Rerun((("a", 7),)))
    assert step.status is None  # failed -> failed
    assert "nothing to rerun" in step.errors[0]["message"]


def test_rerun_of_a_running_workflow_is_ignored() -> None:
    sim = Sim(wf(task("a")))
    sim.start()
    step = sim.advance(Rerun((("a", 0),)))
    assert (step.children, step.status) == ((), None)


def test_rerun_continues_what_the_failure_stopped() -> None:
    sim = Sim(wf(task("a", to("c")), task("b"), task("c")))
    sim.start()
    sim.finish("b", None, "failed")
    step = sim.finish("a")
    assert step.status == "failed"
    assert sim.run("c").status == "waiting"
    step = sim.advance(Rerun((("b", 0),)))
    assert sorted((c.task, c.iteration) for c in step.children) == [("b", 1), ("c", 0)]
    sim.finish("b", iteration=1)
    assert sim.finish("c").status == "succeeded"


def test_rerun_lets_a_join_that_could_not_fire_wait_again() -> None:
    sim = Sim(wf(task("a", to("j")), task("b", to("j", when="<% succeeded() %>")), task("j", join="all")))
    sim.start()
    sim.finish("a")
    step = sim.finish("b", None, "failed")
    assert step.status == "failed"
    step = sim.advance(Rerun((("b", 0),)))
    assert [(c.task, c.iteration) for c in step.children] == [("b", 1)]
    assert sim.run("j").status == "waiting"
    step = sim.finish("b", iteration=1)
    assert [(c.task, c.iteration) for c in step.children] == [("j", 0)]
    assert sim.finish("j").status == "succeeded"


def test_rerun_of_a_join_that_could_not_fire_starts_it() -> None:
    sim = Sim(wf(task("a", to("j")), task("b", to("j", when="<% failed() %>")), task("j", join="all")))
    sim.start()
    sim.finish("a")
    assert sim.finish("b").status == "failed"  # the join can never be satisfied
    step = sim.advance(Rerun((("j", 0),)))
    assert [(c.task, c.iteration) for c in step.children] == [("j", 1)]
    assert sim.finish("j", iteration=1).status == "succeeded"


def test_cancel_running_among_ten_thousand_children_is_quick() -> None:
    import time

    sim = Sim(wf(task("t", with_items=WithItems(list(range(10_000))))))
    sim.start()
    started = time.monotonic()
    step = sim.advance(CancelRequested("cancel_running"))
    assert time.monotonic() - started < 2
    assert len(step.cancel) == 10_000
    assert len(set(step.cancel)) == 10_000
