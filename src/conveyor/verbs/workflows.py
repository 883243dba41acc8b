"""Workflow definitions: register (``register_workflow``, a new version each time) and
delete (``delete_workflow``, every version). One body each, run by ``drive.run`` (SDK,
CLI) and ``drive.run_async`` (API). Parsing and validating a definition is the domain's
(workflows/registration.py); the verb reads the actions a definition may name, has it
checked (as work its driver may run off an event loop), and stores what passed. Pausing,
resuming and rerunning a workflow execution are executions' verbs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.domain.documents import DEFAULT_LIMITS, Limits
from conveyor.domain.errors import NotFoundError
from conveyor.verbs.common import refusals
from conveyor.verbs.drive import Verb, offload, sql
from conveyor.workflows.graph import graph
from conveyor.workflows.registration import Definition, Registration, prepare
from conveyor.workflows.spec import WorkflowSpec


def register(definitions: Sequence[Definition], limits: Limits = DEFAULT_LIMITS) -> Verb[list[dict[str, Any]]]:
    """Several definitions in one transaction, all or none: ``[{"ref", "version"}]`` in
    order. InvalidWorkflowError lists every problem of every definition (nothing is
    stored); a ref that is another runner type's action is a ConflictError."""
    known = yield sql("workflow_known_actions", fetch="all")
    # YAML and expressions are CPU work: the async driver runs it in a thread.
    registrations: list[Registration] = yield offload(prepare, definitions, [r["ref"] for r in known], limits)
    out = []
    with refusals():
        for r in registrations:
            row = yield sql("register_workflow", r.params())
            assert row is not None  # the function returns a version or raises
            out.append({"ref": r.spec.ref, "version": int(row["version"])})
    return out


def delete(ref: str) -> Verb[int]:
    """Every version of ``ref`` marked deleted: how many there were (none: NotFoundError).
    Running executions finish on their version."""
    row = yield sql("delete_workflow", {"ref": ref})
    if row is None or not row["versions"]:
        raise not_found(ref)
    return int(row["versions"])


def not_found(ref: str, version: int | None = None) -> NotFoundError:
    which = f"version {version} of " if version is not None else ""
    return NotFoundError(f"no {which}workflow {ref!r} (see `conveyor workflows list`)")


def found(
    ref: str, version: int | None, row: Mapping[str, Any] | None, versions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A ``get_workflow`` row with its ``versions`` and ``graph`` (nodes, edges)."""
    if row is None:
        raise not_found(ref, version if versions else None)
    spec = WorkflowSpec.from_json(row["definition"])
    return {**row, "versions": [dict(v) for v in versions], "graph": graph(spec).to_json()}
