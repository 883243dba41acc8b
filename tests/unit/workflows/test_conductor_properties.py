"""The conductor under random orders of child completions, duplicates included."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.workflows.state import ChildEnded, NewChild
from unit.workflows.conductor_kit import RetrySpec, Sim, WithItems, envelope, task, to, wf

TERMINAL = {"succeeded", "failed", "cancelled"}
OK = "<% succeeded() %>"


def fan_out_join() -> Sim:
    return Sim(
        wf(
            task("start", to("a", "b", "c"), action=None),
            task("a", to("j", when=OK), retry=RetrySpec(count=2)),
            task("b", to("j", when=OK)),
            task("c", to("j", when=OK), with_items=WithItems([0, 1, 2, 3, 4], concurrency=2), retry=RetrySpec(count=1)),
            task("j", to("end", when=OK), join="all"),
            task("end"),
            output=(("n", "<% len(task(c).result) %>"),),
        )
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_completion_orders_keep_the_invariants(data: st.DataObject) -> None:
    sim = fan_out_join()
    sim.start()
    sent: list[ChildEnded] = []
    for _ in range(100):
        running = sim.running()
        if not running:
            break
        batch = data.draw(st.lists(st.sampled_from(running), min_size=1, max_size=len(running), unique=True))
        events = [
            sim.ended(e, data.draw(st.sampled_from(["completed", "completed", "failed"])), envelope(e)) for e in batch
        ]
        if sent and data.draw(st.booleans()):
            events.insert(data.draw(st.integers(0, len(events))), data.draw(st.sampled_from(sent)))
        sent.extend(events)
        before = sim.status
        step = sim.advance(*events)
        if before in TERMINAL:
            assert step.children == ()  # nothing starts after the workflow ended
    children: list[NewChild] = list(sim.children.values())
    # Each (task, iteration, index) is requested once per retry number.
    chains = Counter((c.task, c.iteration, c.index, c.retry) for c in children)
    assert max(chains.values()) == 1
    assert all(c.retry <= {"a": 2, "c": 1}.get(c.task, 0) for c in children)
    # No child was replaced while it ran: every child requested was ended by an event.
    assert set(sim.children) <= {e.execution for e in sent}
    # The join fired once (at most: a failed branch means it never fires).
    assert sum(1 for c in children if c.task == "j") <= 1
    assert [k for k in sim.state.tasks if k[0] == "j"] in ([], [("j", 0)])
    # All children ended: the workflow ended.
    assert sim.running() == []
    assert sim.status in TERMINAL
    assert not any(r.status == "running" for r in sim.state.tasks.values())
    if sim.status == "succeeded":
        assert sim.run("j").status == "succeeded"
        assert sim.run("c").result == [sim.execution(("c", 0, i)) for i in range(5)]  # the last child's result
        assert sim.output() == {"n": 5}
        assert sim.state.errors == ()
    else:
        assert sim.status == "failed"
        assert sim.state.errors


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(6))), st.integers(1, 6))
def test_items_results_follow_item_order_for_any_completion_order(order: list[int], concurrency: int) -> None:
    sim = Sim(wf(task("t", with_items=WithItems(list(range(6)), concurrency=concurrency), input={"i": "<% item() %>"})))
    sim.start()
    pending = list(order)
    while sim.status == "running":
        running = {sim.child(e).index: e for e in sim.running()}
        assert len(running) <= concurrency
        index = next(i for i in pending if i in running)
        pending.remove(index)
        sim.end(running[index], "completed", envelope(f"r{index}"))
    assert sim.status == "succeeded"
    assert sim.run("t").result == [f"r{i}" for i in range(6)]
