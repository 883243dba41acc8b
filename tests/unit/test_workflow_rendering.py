"""How workflows are shown: ``conveyor workflows get`` (the definition and its graph as
text), the task tree of ``conveyor executions get``, registration problems one per line,
and the dashboard's SVG graph with each task's state (escaped, coloured by class: the
page's CSP allows no inline style)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conveyor.api.dashboard.web import templates
from conveyor.api.dashboard.workflow_views import graph_view
from conveyor.cli import context
from conveyor.cli.workflows import read_definitions, show_tree, show_workflow
from conveyor.domain.errors import ConveyorError, InvalidWorkflowError
from conveyor.workflows.spec import InputSpec, TaskSpec, Transition, WithItems, WorkflowSpec

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context.console, "width", 10_000)


def rendered(fn: Any, *args: Any) -> str:
    with context.console.capture() as captured:
        fn(*args)
    return captured.get()


def deploy() -> WorkflowSpec:
    return WorkflowSpec(
        "ops.deploy",
        description="Deploy [red]everywhere[/red]",
        input=(InputSpec("hosts"), InputSpec("retries", True, 3)),
        tasks={
            "build": TaskSpec("build", "ops.build", next=(Transition("<% succeeded() %>", (), ("push",)),
                                                          Transition("<% failed() %>", (), ("fail",)))),
            "push": TaskSpec("push", "core.echo", with_items=WithItems("<% ctx(hosts) %>")),
        },
        output=(("image", "<% ctx(image) %>"),),
    )  # fmt: skip


def test_workflows_get_shows_inputs_and_the_graph() -> None:
    workflow = {"definition": deploy().to_json(), "version": 2, "registered": NOW, "source": "",
                "versions": [{"version": 1}, {"version": 2}]}  # fmt: skip
    out = rendered(show_workflow, workflow)
    assert out.startswith("workflow ops.deploy  version 2 of 2\n")
    assert "Deploy [red]everywhere[/red]" in out  # literally: never markup
    assert "input: hosts, retries=3" in out
    assert "output: image" in out
    assert "graph (2 tasks; start: build)" in out
    assert "  build  (ops.build)  start\n" in out
    assert "    when <% succeeded() %> -> push\n" in out
    assert "    when <% failed() %> -> fail\n" in out
    assert "  push  (core.echo)  with items\n" in out


def child(index: int | None, status: str = "succeeded", execution: int = 11, result: str = '"ok"') -> dict[str, Any]:
    return {"index": index, "status": status, "retry": 1 if status == "failed" else 0, "execution": execution,
            "execution_status": "completed" if status == "succeeded" else status, "attempt": 1,
            "action_ref": "core.echo", "result": result}  # fmt: skip


def task(name: str, status: str, children: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for c in children:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    return {"task": name, "iteration": 0, "status": status, "items_total": None, "error": None, "created": NOW,
            "ended": None, "children": children, "children_total": len(children), "counts": counts, **kw}  # fmt: skip


def tree(tasks: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"execution": 10, "workflow_ref": "ops.deploy", "version": 2, "status": "running", "output": None,
            "errors": [], "depth": 0, "cancel_policy": "allow_finish", "rerun_of": None, "created": NOW,
            "updated": NOW, "tasks": tasks, **kw}  # fmt: skip


def test_the_task_tree_has_a_row_per_task_and_per_item() -> None:
    items = [child(0, execution=12), child(1, "failed", execution=13, result="[boom]"), child(2, "running", 14, "")]
    out = rendered(show_tree, tree([
        task("build", "succeeded", [child(None, execution=11, result='"image:1"')]),
        task("push", "running", items, items_total=5, children_total=5,
             counts={"succeeded": 2, "failed": 1, "running": 2}),
        task("route", "succeeded", []),
    ], rerun_of=9), 3)  # fmt: skip
    assert out.startswith("workflow ops.deploy version 2  running  rerun of 9\n")
    lines = out.splitlines()

    def row(*cells: str) -> bool:
        return any(all(c in ln for c in cells) and ln.index(cells[0]) < ln.index(cells[-1]) for ln in lines)

    assert row("build", "succeeded", "11", "completed", '"image:1"')
    assert row("push", "5 items", "running", "failed 1, running 2, succeeded 2")
    assert row("[0]", "succeeded", "12", "completed")
    assert row("[1]", "failed", "13", "[boom]")  # markup-like text as it is
    assert row("[2]", "running", "14")
    assert row("… 2 more", "(--items 3 shows the first 3)")
    assert row("route", "succeeded")


def test_a_failed_workflow_shows_its_errors_and_an_empty_one_says_so() -> None:
    errors = [{"task": "build", "expression": "<% ctx(x) %>", "message": "no x"}]
    out = rendered(show_tree, tree([], status="failed", errors=errors), 20)
    assert '  error: {"task": "build", "expression": "<% ctx(x) %>", "message": "no x"}' in out
    assert "(no task started yet)" in out


def test_registration_problems_are_one_line_each() -> None:
    exc = InvalidWorkflowError([("a.yaml", "tasks.x.action", "unknown action 'nope.x'"), ("b.yaml", "", "no tasks")])
    assert exc.lines() == ["a.yaml: tasks.x.action: unknown action 'nope.x'", "b.yaml: no tasks"]
    assert "\n" not in str(exc)


def test_files_that_cannot_be_read_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConveyorError, match=r"cannot read .*missing\.yaml"):
        read_definitions([tmp_path / "missing.yaml"], None)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"ref: a.b\n\xff\xfe")
    with pytest.raises(ConveyorError, match="not UTF-8 text"):
        read_definitions([binary], None)
    good = tmp_path / "g.yaml"
    good.write_text("tasks: {}")
    with pytest.raises(ConveyorError, match="--ref names one definition"):
        read_definitions([good, good], "a.b")
    (d,) = read_definitions([good], "a.b")
    assert (d.text, d.ref, d.where) == ("tasks: {}", "a.b", str(good))


# -- the dashboard's graph -------------------------------------------------------------------


def svg(view: Any) -> str:
    return templates.get_template("_graph.html").render(view=view)


def test_the_graph_colours_tasks_by_their_latest_state_and_links_single_children() -> None:
    states = [
        {"task": "build", "iteration": 1, "status": "succeeded", "items_total": None, "items_done": 1, "child": 41},
        {"task": "push", "iteration": 0, "status": "running", "items_total": 5, "items_done": 2, "child": None},
    ]
    view = graph_view(deploy().to_json(), states)
    notes = {t.box.name: (t.state, t.note, t.href) for t in view.tasks}
    assert notes == {"build": ("succeeded", "succeeded · ×2", "/executions/41"),
                     "push": ("running", "running · 2/5 items", None)}  # fmt: skip
    out = svg(view)
    assert 'class="wf-task g-succeeded" data-task="build"' in out
    assert 'class="wf-task g-running" data-task="push"' in out
    assert '<a href="/executions/41">' in out
    assert out.count('class="wf-edge"') == 1
    assert "style=" not in out  # the CSP forbids inline style


def test_a_long_note_is_cut_to_its_box_and_whole_in_the_tooltip() -> None:
    states = [{"task": "push", "iteration": 11, "status": "succeeded", "items_total": 100000, "items_done": 100000,
               "child": None}]  # fmt: skip
    (push,) = [t for t in graph_view(deploy().to_json(), states).tasks if t.box.name == "push"]
    assert push.note.endswith("…")
    assert "succeeded · ×12 · 100000/100000 items".startswith(push.note[:-1])
    assert push.title.endswith(": succeeded · ×12 · 100000/100000 items")


def test_a_task_not_entered_is_drawn_as_not_started_and_names_are_escaped() -> None:
    spec = WorkflowSpec("t.x", tasks={"<b>&x": TaskSpec("<b>&x", "core.noop")})
    view = graph_view(spec.to_json())
    assert [t.state for t in view.tasks] == ["none"]
    out = svg(view)
    assert "<b>" not in out
    assert "&lt;b&gt;&amp;x" in out
