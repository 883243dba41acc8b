"""The conductor: joins."""

from __future__ import annotations

from unit.workflows.conductor_kit import Sim, task, to, wf

KO = "<% failed() %>"


def fan(join: object, n: int = 3) -> Sim:
    branches = [task(f"b{i}", to("j")) for i in range(n)]
    return Sim(wf(*branches, task("j", join=join)))


def test_join_all_waits_for_every_inbound_task_then_starts_once() -> None:
    sim = fan("all")
    sim.start()
    step = sim.finish("b0")
    assert step.children == ()
    assert (sim.run("j").status, sim.run("j").arrivals) == ("waiting", ("b0",))
    sim.finish("b2")
    step = sim.finish("b1")
    assert sim.names(step) == ["j"]
    assert sim.run("j").arrivals == ("b0", "b2", "b1")
    assert sim.finish("j").status == "succeeded"
    assert [k for k in sim.state.tasks if k[0] == "j"] == [("j", 0)]


def test_join_all_fires_once_when_all_arrive_in_one_advance() -> None:
    sim = fan("all")
    sim.start()
    step = sim.advance(*(sim.ended(e) for e in sim.running()))
    assert sim.names(step) == ["j"]


def test_join_n_fires_at_the_nth_arrival_and_ignores_later_ones() -> None:
    sim = fan(2)
    sim.start()
    assert sim.finish("b1").children == ()
    step = sim.finish("b0")
    assert sim.names(step) == ["j"]
    step = sim.finish("b2")
    assert step.children == ()
    assert sim.run("j").arrivals == ("b1", "b0", "b2")  # recorded, ignored
    assert ("j", 1) not in sim.state.tasks
    assert sim.finish("j").status == "succeeded"


def test_no_join_starts_an_instance_per_arrival() -> None:
    sim = fan(None, 2)
    sim.start()
    assert [(c.task, c.iteration) for c in sim.finish("b0").children] == [("j", 0)]
    assert [(c.task, c.iteration) for c in sim.finish("b1").children] == [("j", 1)]


def test_a_task_routing_success_and_failure_to_the_join_counts_once() -> None:
    sim = Sim(
        wf(task("a", to("j", when="<% succeeded() %>"), to("j", when=KO)), task("b", to("j")), task("j", join="all"))
    )
    sim.start()
    sim.finish("a", None, "failed")
    step = sim.finish("b")
    assert sim.names(step) == ["j"]


def test_a_join_that_can_never_be_satisfied_fails_the_workflow() -> None:
    sim = Sim(wf(task("a", to("j")), task("b", to("j", when="<% failed() %>")), task("j", join="all")))
    sim.start()
    sim.finish("a")
    step = sim.finish("b")
    assert step.status == "failed"
    assert step.errors[0]["type"] == "join"
    assert "'j' can never be satisfied" in step.errors[0]["message"]
    assert sim.run("j").status == "failed"


def test_a_cycle_through_a_join_opens_its_next_iteration() -> None:
    spec = wf(
        task("init", to("a", "b", publish={"n": 0}), action=None),
        task("a", to("j")),
        task("b", to("j")),
        task("j", to("a", "b", when="<% ctx(n) < 1 %>", publish={"n": "<% ctx(n) + 1 %>"}), join="all"),
    )
    sim = Sim(spec)
    sim.start()
    sim.finish("a")
    sim.finish("b")
    step = sim.finish("j")
    assert sorted((c.task, c.iteration) for c in step.children) == [("a", 1), ("b", 1)]
    sim.finish("a", iteration=1)
    step = sim.finish("b", iteration=1)
    assert [(c.task, c.iteration) for c in step.children] == [("j", 1)]
    assert sim.finish("j", iteration=1).status == "succeeded"


def test_arrivals_while_paused_are_recorded_and_the_join_starts_on_resume() -> None:
    from conveyor.workflows.state import PauseRequested, ResumeRequested

    sim = fan("all", 2)
    sim.start()
    sim.advance(PauseRequested())
    sim.finish("b0")
    step = sim.finish("b1")
    assert step.children == ()
    assert (sim.run("j").status, sim.run("j").arrivals) == ("waiting", ("b0", "b1"))
    assert sim.status == "paused"
    step = sim.advance(ResumeRequested())
    assert (sim.names(step), step.status) == (["j"], "running")
