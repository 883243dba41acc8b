"""What the dashboard shows of workflows: the definitions (``/workflows``, ``/workflows/{ref}``)
and, on a workflow execution's page, its graph with each task's live state and its task
tree. ``graph_view`` is pure (the layout of layout.py plus a state per task); the loaders
read with the named queries of ``workflows_read.sql``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.api.dashboard.layout import FONT_NOTE, PAD_X, Box, Layout, fit, layout
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q
from conveyor.workflows.graph import graph
from conveyor.workflows.spec import WorkflowSpec

TREE_ITEMS = 20  # child chains shown per task instance on an execution's page
# A task's state as drawn: the conductor's task statuses, plus "none" (not entered yet) and
# "pending" (running, waiting for an inquiry's answer: workflow_task_states).
TASK_STATES = ("none", "waiting", "running", "pending", "succeeded", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class TaskView:
    box: Box
    state: str  # one of TASK_STATES: its CSS class g-<state>
    note: str  # under its name: the state, the iteration, items done
    title: str  # its tooltip
    href: str | None  # its one child execution's page


@dataclass(frozen=True, slots=True)
class GraphView:
    layout: Layout
    tasks: tuple[TaskView, ...]


def graph_view(definition: Mapping[str, Any], states: Sequence[Mapping[str, Any]] = ()) -> GraphView:
    """The definition's graph laid out, each task with the state of its latest instance
    (``workflow_task_states`` rows; a task without one is ``none``)."""
    spec = WorkflowSpec.from_json(dict(definition))
    placed = layout(graph(spec))
    by_task = {s["task"]: s for s in states}
    tasks = []
    for box in placed.boxes:
        s = by_task.get(box.name)
        action = box.action or "no action"
        if s is None:
            tasks.append(TaskView(box, "none", "not started", f"{box.name} ({action}): not started", None))
            continue
        state = s["status"] if s["status"] in TASK_STATES else "none"
        parts = [state]
        if s["iteration"]:
            parts.append(f"×{s['iteration'] + 1}")
        if s["items_total"] is not None:
            parts.append(f"{s['items_done']}/{s['items_total']} items")
        note = " · ".join(parts)
        href = f"/executions/{s['child']}" if s.get("child") else None
        shown = fit(note, box.w - 2 * PAD_X, FONT_NOTE)  # the whole note is in the tooltip
        tasks.append(TaskView(box, state, shown, f"{box.name} ({action}): {note}", href))
    return GraphView(placed, tuple(tasks))


async def workflow_of(conn: AsyncConn, eid: int) -> dict[str, Any] | None:
    """A workflow execution's graph with live states and its task tree; None for an
    execution that is not a started workflow."""
    workflow = await (await conn.execute(Q["workflow_of_execution"], {"id": eid})).fetchone()
    if workflow is None:
        return None
    states = await (await conn.execute(Q["workflow_task_states"], {"id": eid})).fetchall()
    tasks = await (await conn.execute(Q["workflow_tree"], {"id": eid, "items": TREE_ITEMS})).fetchall()
    return {"state": workflow, "graph": graph_view(workflow["definition"], states), "tasks": tasks}


async def workflows(conn: AsyncConn) -> dict[str, Any]:
    return {"workflows": await (await conn.execute(Q["list_workflows"])).fetchall()}


async def workflow(conn: AsyncConn, ref: str) -> dict[str, Any] | None:
    row = await (await conn.execute(Q["get_workflow"], {"ref": ref, "version": None})).fetchone()
    if row is None:
        return None
    versions = await (await conn.execute(Q["workflow_versions"], {"ref": ref})).fetchall()
    return {"workflow": row, "versions": versions, "graph": graph_view(row["definition"])}
