"""The REST API's workflow bodies (``/api/v1/workflows``, an execution's tree and children)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


class WorkflowIn(BaseModel):
    """A definition to register: ``source`` (YAML text, as in a file) or ``definition``
    (the same document as JSON); ``ref`` names one that has no ``ref:``."""

    source: str | None = Field(None, description="the YAML text", examples=["ref: ops.hello\ntasks: ..."])
    definition: dict[str, Any] | None = Field(None, description="the definition as JSON (the YAML document's shape)")
    ref: str | None = Field(None, min_length=1, max_length=255, description="its ref, when it names none")

    @model_validator(mode="after")
    def _one_of(self) -> WorkflowIn:
        if (self.source is None) == (self.definition is None):
            raise ValueError("give the definition as either source (YAML text) or definition (JSON), not both")
        return self


class GraphNodeOut(BaseModel):
    name: str
    action: str | None
    start: bool = Field(..., description="no inbound transition: starts first")
    join: str | int | None
    with_items: bool
    next: list[dict[str, Any]] = Field(..., description="its transitions: when, do (tasks and commands)")


class GraphEdgeOut(BaseModel):
    from_: str = Field(..., alias="from")
    to: str
    when: str | None


class GraphOut(BaseModel):
    nodes: list[GraphNodeOut]
    edges: list[GraphEdgeOut]


class WorkflowVersionOut(BaseModel):
    version: int
    registered: datetime
    description: str
    running: int = Field(..., description="executions running (or paused, canceling) on this version now")


class WorkflowSummaryOut(BaseModel):
    ref: str
    version: int = Field(..., description="the latest version")
    description: str
    registered: datetime = Field(..., description="when the latest version was registered")
    tasks: int
    versions: int


class WorkflowOut(BaseModel):
    ref: str
    version: int
    description: str
    registered: datetime
    definition: dict[str, Any] = Field(..., description="the stored form (what runs)")
    source: str = Field(..., description="the YAML as registered (empty when built in Python)")
    versions: list[WorkflowVersionOut]
    graph: GraphOut


class WorkflowDeleted(BaseModel):
    ref: str
    versions: int = Field(..., description="how many versions were deleted")


class ProblemOut(BaseModel):
    """A problem of the definition (``path`` in it: ``tasks.deploy.next[0].do``), or of the
    request body itself (``field``), as every 422 of the API names it."""

    path: str | None = Field(None, description="where in the definition")
    field: str | None = Field(None, description="which field of the request body")
    message: str


class InvalidWorkflowOut(BaseModel):
    error: str
    problems: list[ProblemOut]


class TaskChildOut(BaseModel):
    index: int | None = Field(..., description="the item index of a `with` task; null otherwise")
    status: str = Field(..., description="the child chain's status: running, succeeded, failed, cancelled")
    retry: int = Field(..., description="retries used")
    execution: int | None = Field(..., description="the current child execution")
    execution_status: str | None
    attempt: int | None
    action_ref: str | None
    result: str | None = Field(..., description="the child's error, else its data, else its result (120 chars)")


class TaskOut(BaseModel):
    task: str
    iteration: int = Field(..., description="0, and one more each time a cycle enters the task again")
    status: str
    items_total: int | None
    error: str | None
    created: datetime
    ended: datetime | None
    children: list[TaskChildOut] = Field(..., description="the first `items` child chains, by item index")
    children_total: int
    counts: dict[str, int] = Field(..., description="child chains by status")


class TreeOut(BaseModel):
    execution: int
    workflow_ref: str
    version: int
    status: str
    output: Any = None
    errors: list[Any]
    depth: int
    cancel_policy: str
    rerun_of: int | None = Field(..., description="the execution this one reruns")
    created: datetime
    updated: datetime
    tasks: list[TaskOut]


class RerunIn(BaseModel):
    from_failed: bool = Field(False, description="a failed workflow: rerun its failed tasks, keep what completed")


class CancelIn(BaseModel):
    policy: Literal["allow_finish", "cancel_running"] | None = Field(
        None, description="a running workflow: let its children finish (default) or cancel them"
    )


class StatusOut(BaseModel):
    id: int
    status: str
