"""A workflow's graph (workflows/graph.py) and where the dashboard draws it
(api/dashboard/layout.py): layers from the start tasks, joins below every branch, cycles
drawn back up, nothing overlapping."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.api.dashboard.layout import FONT_NAME, GAP_Y, NODE_H, NODE_W, PAD_X, fit, layout, text_width
from conveyor.workflows.graph import describe, graph
from conveyor.workflows.spec import TaskSpec, Transition, WithItems, WorkflowSpec


def spec(edges: dict[str, list[str]], **tasks: TaskSpec) -> WorkflowSpec:
    """Tasks named by ``edges`` (definition order), each with one transition to its targets."""
    built = {
        name: tasks.get(name) or TaskSpec(name, "core.noop", next=(Transition(None, (), tuple(do)),) if do else ())
        for name, do in edges.items()
    }
    return WorkflowSpec("t.wf", tasks=built)


def layers(edges: dict[str, list[str]]) -> dict[str, int]:
    return {b.name: b.layer for b in layout(graph(spec(edges))).boxes}


def test_the_graph_keeps_tasks_transitions_and_commands() -> None:
    tasks = {
        "build": TaskSpec("build", "core.local", next=(
            Transition("<% succeeded() %>", (), ("deploy", "notify")), Transition("<% failed() %>", (), ("fail",)))),
        "deploy": TaskSpec("deploy", "core.echo", with_items=WithItems("<% ctx(hosts) %>"), join="all"),
        "notify": TaskSpec("notify"),
    }  # fmt: skip
    g = graph(WorkflowSpec("ops.deploy", tasks=tasks))
    assert g.to_json() == {
        "nodes": [
            {"name": "build", "action": "core.local", "start": True, "join": None, "with_items": False,
             "next": [{"when": "<% succeeded() %>", "do": ["deploy", "notify"]},
                      {"when": "<% failed() %>", "do": ["fail"]}]},
            {"name": "deploy", "action": "core.echo", "start": False, "join": "all", "with_items": True, "next": []},
            {"name": "notify", "action": None, "start": False, "join": None, "with_items": False, "next": []},
        ],
        "edges": [
            {"from": "build", "to": "deploy", "when": "<% succeeded() %>"},
            {"from": "build", "to": "notify", "when": "<% succeeded() %>"},
        ],
    }  # fmt: skip
    assert describe(g) == [
        "build  (core.local)  start",
        "  when <% succeeded() %> -> deploy, notify",
        "  when <% failed() %> -> fail",
        "deploy  (core.echo)  with items, join all",
        "notify  (no action)",
    ]


def test_a_chain_is_one_task_per_layer() -> None:
    assert layers({"a": ["b"], "b": ["c"], "c": []}) == {"a": 0, "b": 1, "c": 2}


def test_a_join_sits_below_its_longest_branch() -> None:
    got = layers({"start": ["short", "long1"], "short": ["join"], "long1": ["long2"], "long2": ["join"], "join": []})
    assert got == {"start": 0, "short": 1, "long1": 1, "long2": 2, "join": 3}


def test_several_start_tasks_share_the_first_layer() -> None:
    assert layers({"a": ["c"], "b": ["c"], "c": []}) == {"a": 0, "b": 0, "c": 1}


def test_a_cycle_is_layered_and_its_closing_edge_drawn_back() -> None:
    edges = {"init": ["check"], "check": ["work"], "work": ["check", "done"], "done": []}
    result = layout(graph(spec(edges)))
    assert {b.name: b.layer for b in result.boxes} == {"init": 0, "check": 1, "work": 2, "done": 3}
    assert {(ln.source, ln.target) for ln in result.lines if ln.back} == {("work", "check")}
    assert len(result.lines) == 4


def test_a_task_starting_itself_is_a_loop() -> None:
    result = layout(graph(spec({"poll": ["poll", "done"], "done": []})))
    assert [(ln.source, ln.target, ln.back) for ln in result.lines] == [("poll", "poll", True), ("poll", "done", False)]


def test_a_cycle_without_a_start_task_is_still_drawn() -> None:
    # Registration refuses it (unreachable tasks), but a stored definition is drawn whatever it is.
    assert layers({"a": ["b"], "b": ["a"]}) == {"a": 0, "b": 1}


def test_empty_and_long_names() -> None:
    empty = layout(graph(WorkflowSpec("t.empty")))
    assert (empty.boxes, empty.lines) == ((), ())
    room = NODE_W - 2 * PAD_X
    for name in ["x" * 100, "build_windows_and_macos_together", "W" * 30, "日本語のタスク名" * 3]:
        (box,) = layout(graph(spec({name: []}))).boxes
        assert box.name == name
        kept = box.label[:-1]
        assert box.label.endswith("…"), box.label
        assert name.startswith(kept), box.label
        assert text_width(box.label, FONT_NAME) <= room, box.label  # it fits ...
        assert text_width(name[: len(kept) + 1] + "…", FONT_NAME) > room, box.label  # ... and one more would not
    (short,) = layout(graph(spec({"checkout": []}))).boxes
    assert short.label == "checkout"


def test_text_is_cut_by_its_width_not_its_length() -> None:
    # Measured in Chromium with DejaVu Sans Bold at 12 px: 22 characters of this name took
    # 176 px, more than a box had; the estimate must be at least the real width.
    assert text_width("build_windows_and_mac…", 12) >= 176
    assert len(fit("i" * 60, 100, 12)) > len(fit("m" * 60, 100, 12))
    assert fit("exactly", text_width("exactly", 12), 12) == "exactly"
    assert fit("abc", 1, 12) == "…"  # nothing fits: the ellipsis alone


def test_rows_follow_their_parents_to_avoid_crossings() -> None:
    # b's child is defined first but drawn under b's position, after a's child.
    edges = {"a": ["a_child"], "b": ["b_child"], "b_child": [], "a_child": []}
    boxes = {b.name: b for b in layout(graph(spec(edges))).boxes}
    assert boxes["a"].x < boxes["b"].x
    assert boxes["a_child"].x < boxes["b_child"].x


names = st.sampled_from([f"t{i}" for i in range(8)])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(names, st.lists(names, max_size=4), min_size=1))
def test_any_graph_is_laid_out_without_overlap_and_inside_the_picture(edges: dict[str, list[str]]) -> None:
    result = layout(graph(spec(edges)))
    assert [b.name for b in result.boxes] == list(edges)
    for a, b in itertools.combinations(result.boxes, 2):
        assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y, (a, b)
    for b in result.boxes:
        assert b.x >= 0
        assert b.y >= 0
        assert b.x + b.w <= result.width
        assert b.y + b.h <= result.height
        assert b.y == 12 + b.layer * (NODE_H + GAP_Y)
    # Every forward edge goes down a layer at least; the others close a cycle.
    layer = {b.name: b.layer for b in result.boxes}
    for ln in result.lines:
        assert ln.back or layer[ln.target] > layer[ln.source], ln
    assert len(result.lines) == len({(s, t) for s, ts in edges.items() for t in ts if t in edges})
