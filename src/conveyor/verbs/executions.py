"""Execution verbs: one body each, run by ``drive.run`` (SDK, CLI) and ``drive.run_async``
(API). The SQL functions decide; what is here is what their answers mean."""

from __future__ import annotations

from conveyor.verbs.common import cancelled, refusals
from conveyor.verbs.drive import Verb, sql


def cancel(execution_id: int, by: str, policy: str | None = None) -> Verb[str]:
    """``cancel_execution`` (or ``cancel_workflow`` with a children ``policy``): the new
    status, ``cancelled`` or ``canceling``; a finished execution is a ConflictError. One
    statement: a driver given ``retries`` runs it again after a deadlock."""
    with refusals():
        if policy is None:
            row = yield sql("cancel_execution", {"id": execution_id, "by": by})
        else:
            row = yield sql("cancel_workflow", {"id": execution_id, "by": by, "policy": policy})
    return cancelled(execution_id, row)
