"""Orquesta's semantics keep these definitions finite, and Conveyor's conductor dispatches
what Orquesta's does for them (orquesta_cases.py; the counts come from
bench/orquesta_counts.py, which drives Orquesta's own conductor the same way)."""

from __future__ import annotations

from collections import Counter

import pytest

from conveyor.workflows.parse import parse_workflow
from unit.workflows.conductor_kit import Sim, envelope, task, to, wf
from unit.workflows.orquesta_cases import CASES, Case


def drive(case: Case, max_rounds: int = 1000) -> tuple[dict[str, int], str]:
    """Orquesta's test driver, on Conveyor's conductor: in rounds, every child requested
    ends (in request order, one advancement per round); children counted by task."""
    sim = Sim(parse_workflow(case.definition, "test.wf"))
    step = sim.start()
    dispatched: Counter[str] = Counter()
    for _ in range(max_rounds):
        if not step.children:
            break
        events = []
        for child in step.children:
            dispatched[child.task] += 1
            failed = child.task in case.fail
            result = envelope(None, succeeded=not failed, error="boom" if failed else None)
            execution = sim.execution((child.task, child.iteration, child.index))
            events.append(sim.ended(execution, "failed" if failed else "completed", result))
        step = sim.advance(*events)
    return dict(sorted(dispatched.items())), sim.status


@pytest.mark.parametrize("name", sorted(CASES))
def test_dispatches_what_orquesta_dispatches(name: str) -> None:
    case = CASES[name]
    assert drive(case) == (case.per_task, case.status)


def test_the_retry_command_retries_three_times_then_follows_the_transitions_once() -> None:
    sim = Sim(wf(task("a", to("retry", when="<% failed() %>"), to("b", when="<% failed() %>")), task("b")))
    sim.start()
    for iteration in range(3):
        step = sim.finish("a", envelope(succeeded=False, error="no"), "failed", iteration=iteration)
        assert [(c.task, c.iteration) for c in step.children] == [("a", iteration + 1)]  # b not yet
    step = sim.finish("a", envelope(succeeded=False, error="no"), "failed", iteration=3)
    assert [c.task for c in step.children] == ["b"]
    assert sim.finish("b").status == "succeeded"  # handled by the entry to b


def test_a_retry_command_that_holds_no_more_follows_the_transitions_at_once() -> None:
    sim = Sim(wf(task("a", to("retry", when="<% failed() %>"), to("b")), task("b")))
    sim.start()
    step = sim.finish("a")
    assert [(c.task, c.iteration) for c in step.children] == [("b", 0)]


def test_a_rerun_counts_the_retry_commands_attempts_afresh() -> None:
    from conveyor.workflows.state import Rerun

    sim = Sim(wf(task("a", to("retry", when="<% failed() %>"))))
    sim.start()
    for iteration in range(4):
        step = sim.finish("a", envelope(succeeded=False, error="no"), "failed", iteration=iteration)
    assert step.status == "failed"
    step = sim.advance(Rerun((("a", 3),)))
    assert [(c.task, c.iteration) for c in step.children] == [("a", 4)]
    step = sim.finish("a", envelope(succeeded=False, error="no"), "failed", iteration=4)
    assert [(c.task, c.iteration) for c in step.children] == [("a", 5)]  # retried again


def test_arrivals_before_the_task_started_make_one_instance() -> None:
    spec = wf(task("f", to("l", "r")), task("l", to("m")), task("r", to("m")), task("m"))
    sim = Sim(spec)
    sim.start()
    sim.finish("f")
    step = sim.advance(sim.ended(sim.execution(("l", 0, None))), sim.ended(sim.execution(("r", 0, None))))
    assert [(c.task, c.iteration) for c in step.children] == [("m", 0)]
    assert sim.run("m").arrivals == ("l", "r")


def test_an_arrival_after_the_task_started_is_a_new_instance() -> None:
    spec = wf(task("f", to("l", "r")), task("l", to("m")), task("r", to("m")), task("m"))
    sim = Sim(spec)
    sim.start()
    sim.finish("f")
    assert [c.task for c in sim.finish("l").children] == ["m"]
    assert [(c.task, c.iteration) for c in sim.finish("r").children] == [("m", 1)]
