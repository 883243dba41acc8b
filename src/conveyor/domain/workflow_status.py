"""The workflow execution and task instance status graphs (``workflow_execution.status``,
``workflow_task.status``).

Written down here; migration 0038 stores the same edges in ``workflow_transition`` and
``workflow_task_transition``, which BEFORE UPDATE triggers consult, so the database refuses
any other change whatever code path attempts it; a test asserts the two agree.

The edges are the changes one advancement stores (executor/workflows.py writes its net
effect): some are several of the conductor's steps at once (paused -> succeeded: a resume
and the end). A row is created in any status (an instance that ends as it starts, a
rerun's copy); only a change is guarded. An ended workflow is never advanced again (its
rerun is a new workflow execution), and an ended task instance changes only when a rerun
makes a failed join wait again.
"""

from __future__ import annotations

WorkflowGraph = dict[str, frozenset[str]]

WORKFLOW_TRANSITIONS: WorkflowGraph = {
    # pause; cancel; the end (a cancel and the end in one advancement: -> cancelled)
    "running": frozenset({"paused", "canceling", "succeeded", "failed", "cancelled"}),
    # resume; cancel; a workflow timeout; a resume or a cancel, then the end
    "paused": frozenset({"running", "canceling", "succeeded", "failed", "cancelled"}),
    # the end once nothing runs; a workflow timeout (or a broken advancement) while canceling
    "canceling": frozenset({"cancelled", "failed"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

TASK_TRANSITIONS: WorkflowGraph = {
    # started (its child or items); an action-less task (or no items) ends at once; an
    # input that fails to evaluate, a join that can never fire; a cancel or timeout
    "waiting": frozenset({"running", "succeeded", "failed", "cancelled"}),
    # its children ended; a task timeout; a cancel or a workflow timeout
    "running": frozenset({"succeeded", "failed", "cancelled"}),
    # a rerun: a join that could not fire waits again (and, reached in the same
    # advancement, starts or ends; or a cancel in the same advancement cancels it)
    "failed": frozenset({"waiting", "running", "succeeded", "cancelled"}),
    "succeeded": frozenset(),
    "cancelled": frozenset(),
}


def edges(graph: WorkflowGraph) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets}
