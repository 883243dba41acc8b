"""The SDK's workflow methods (part of :class:`conveyor.sdk.Client`): register definitions
(YAML text, a file, or a spec built in Python), read and delete them, read a workflow
execution's task tree, pause, resume and rerun it. Each state change is one SQL function
(``register_workflow``, ``delete_workflow``, ``pause_execution``, ``resume_execution``,
``rerun_execution``); the checks around it are shared with the API (workflows/registration.py,
verbs.py).

    with Client(url) as client:
        client.register_workflow(Path("deploy.yaml"))
        client.register_workflow("ref: ops.hello\\ntasks: {hi: {action: core.echo message=hi}}")
        execution_id = client.request("ops.hello")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from conveyor.domain.documents import Limits
from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import common as verbs
from conveyor.verbs import executions
from conveyor.verbs import workflows as definitions_verbs
from conveyor.verbs.drive import run
from conveyor.workflows.registration import Definition
from conveyor.workflows.spec import WorkflowSpec


class Buildable(Protocol):
    """The Python builder (conveyor.workflows.builder.Workflow): registered as the YAML it
    writes, so what is stored is what the equivalent file would give."""

    def to_yaml(self) -> str: ...


def definition_of(workflow: str | Path | WorkflowSpec | Buildable, ref: str | None = None) -> Definition:
    """YAML (or JSON) text, a file path, a spec or a builder as one definition to register."""
    if isinstance(workflow, Path):
        return Definition(text=workflow.read_text(encoding="utf-8"), ref=ref, where=str(workflow))
    if isinstance(workflow, str):
        return Definition(text=workflow, ref=ref)
    if isinstance(workflow, WorkflowSpec):
        return Definition(spec=workflow, ref=ref)
    return Definition(text=workflow.to_yaml(), ref=ref)


class WorkflowMethods:
    conn: Conn
    document_limits: Limits
    verb_retries: int
    user: str | None

    def register_workflow(
        self, workflow: str | Path | WorkflowSpec | Buildable, *, ref: str | None = None
    ) -> dict[str, Any]:
        """Register one definition: YAML text, a ``Path`` to a YAML file, a spec, or a
        builder. Returns ``{"ref", "version"}``; InvalidWorkflowError lists every problem."""
        return self.register_workflows([definition_of(workflow, ref)])[0]

    def register_workflows(self, definitions: Sequence[Definition]) -> list[dict[str, Any]]:
        """Register several definitions in one transaction: all or none."""
        return run(self.conn, definitions_verbs.register(definitions, self.document_limits))

    def workflows(self) -> list[dict[str, Any]]:
        """Every registered workflow with its latest version."""
        return list(self.conn.execute(Q["list_workflows"]).fetchall())

    def workflow(self, ref: str, *, version: int | None = None) -> dict[str, Any]:
        """One definition (the latest version, or ``version``) with ``versions`` and ``graph``."""
        row = self.conn.execute(Q["get_workflow"], {"ref": ref, "version": version}).fetchone()
        versions = self.conn.execute(Q["workflow_versions"], {"ref": ref}).fetchall()
        return definitions_verbs.found(ref, version, row, versions)

    def delete_workflow(self, ref: str) -> int:
        """Delete every version of ``ref``; returns how many there were. Running executions
        finish on their version."""
        return run(self.conn, definitions_verbs.delete(ref))

    def workflow_tree(self, execution_id: int, *, items: int = 100) -> dict[str, Any] | None:
        """A workflow execution's state and task tree (None for an execution that is no
        workflow): each task instance with at most ``items`` of its child chains."""
        workflow = self.conn.execute(Q["workflow_of_execution"], {"id": execution_id}).fetchone()
        if workflow is None:
            return None
        tasks = self.conn.execute(Q["workflow_tree"], {"id": execution_id, "items": items}).fetchall()
        return verbs.workflow_tree(workflow, tasks)

    def children(self, execution_id: int) -> list[dict[str, Any]]:
        return list(
            self.conn.execute(Q["execution_children"], {"id": execution_id, "after": None, "limit": 1000}).fetchall()
        )

    def pause(self, execution_id: int, *, by: str = "sdk") -> str:
        """Pause a running workflow: no new task starts; children in flight finish. Returns the
        new status. A deadlock with the executor is retried (``verb_retries``)."""
        return run(self.conn, lambda: executions.pause(execution_id, by), retries=self.verb_retries)

    def resume(self, execution_id: int, *, by: str = "sdk") -> str:
        """Resume a paused workflow. A deadlock with the executor is retried (``verb_retries``)."""
        return run(self.conn, lambda: executions.resume(execution_id, by), retries=self.verb_retries)

    def rerun(self, execution_id: int, *, from_failed: bool = True, by: str = "sdk") -> int:
        """Rerun an execution; returns the new execution's id. ``from_failed``: a failed (or
        cancelled) workflow from its failed tasks, keeping what completed (``by`` is recorded
        in its rerun event); else a new request of the same action with the same parameters,
        requested by this client's ``user``."""
        verb = executions.rerun(execution_id, from_failed=from_failed, by=by, requested_by=self.user)
        return run(self.conn, verb)
