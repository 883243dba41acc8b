"""The verbs that change state, as the SDK (sync), the API (async) and the CLI share them.

Each verb is one SQL function in the database (``request_execution``,
``request_executions``, ``cancel_execution``, ``cordon_worker``, ``drain_worker``,
``set_admission_policy``, ``delete_admission_policy``, ``replay_dead_letter``,
``register_workflow``, ``delete_workflow``, ``pause_execution``, ``resume_execution``,
``rerun_execution``, ``cancel_workflow``, ``respond_inquiry``, ``register_trigger``,
``delete_trigger``, ``emit_event_once``, ``replay_event``, ``replay_events``); its wake-ups
come from triggers, not from the caller. What is here is only what every caller needs
around that one call, written once: the checks made before it (full JSON Schema, policy
specs) and what its answer means -- an error a user can act on, or the result. A caller
is then one ``execute`` plus these functions, sync or async alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    InvalidParametersError,
    InvalidPayloadError,
    NotFoundError,
    UnknownActionError,
)

# SQLSTATEs the verbs raise (class CV: Conveyor's own).
UNKNOWN_ACTION = "CVA01"
INVALID_PARAMETERS = "CVA02"
KEY_REUSED = "CVA03"
NO_POLICY = "CVN03"
POLICY_FROM_DEFINITION = "CVC02"
NOT_A_WORKFLOW_ACTION = "CVC03"  # register_workflow: the ref is another runner type's action
NOTHING_TO_RERUN = "CVC04"  # rerun_execution: the workflow has not ended, or ended well
NOT_A_WORKFLOW = "CVN04"  # rerun_execution: no such workflow execution
UNKNOWN_TRIGGER = "CVE01"  # emit_event, replay_events: no such trigger
INVALID_PAYLOAD = "CVE02"  # emit_event: the payload fails the trigger's schema
EVENT_KEY_REUSED = "CVE03"  # emit_event: an idempotency key repeated with another payload
IN_USE = "CVC05"  # register_trigger (type changed), delete_trigger (still used), events are immutable
NO_EVENT = "CVN05"  # replay_event: no such event
NO_SCHEDULE = "CVN06"  # fire_schedule, backfill_schedule: no such schedule
SCHEDULE_EXISTS = "CVC06"  # create_schedule without replace: the name is taken


def translate(
    exc: psycopg.Error, *, action_ref: str = "", target: str = "", refs: Sequence[str] = ()
) -> ConveyorError | psycopg.Error:
    """A verb's refusal as the error a user can act on; anything else unchanged. ``refs``:
    the refs of the request_execution_batch statement that raised (a batch's refusal names
    its row by position)."""
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == UNKNOWN_ACTION:
        ref = action_ref or _batch_row_ref(exc, refs)
        return UnknownActionError(ref) if ref else exc
    if exc.sqlstate == INVALID_PARAMETERS:
        # request_execution_batch puts the refused row's ref, position and problems in the
        # message alone (migration 0023 sets no DETAIL for CVA02): read from there.
        ref, _, problems = message.removeprefix("invalid parameters for ").partition(": ")
        return InvalidParametersError(action_ref or ref, [problems or message])
    if exc.sqlstate == KEY_REUSED:
        return ConflictError(f"{message}: {exc.diag.message_hint}" if exc.diag.message_hint else message)
    if exc.sqlstate == NO_POLICY:
        return policy_not_found(target)
    if exc.sqlstate in (POLICY_FROM_DEFINITION, NOT_A_WORKFLOW_ACTION, NOTHING_TO_RERUN):
        return ConflictError(message)
    if exc.sqlstate in (NOT_A_WORKFLOW, UNKNOWN_TRIGGER, NO_EVENT, NO_SCHEDULE):
        return NotFoundError(f"{message}: {exc.diag.message_hint}" if exc.diag.message_hint else message)
    if exc.sqlstate == INVALID_PAYLOAD:
        trigger, _, problems = message.removeprefix("invalid payload for trigger ").partition(": ")
        return InvalidPayloadError(trigger, problems.split("; "))
    if exc.sqlstate in (EVENT_KEY_REUSED, IN_USE, SCHEDULE_EXISTS):
        return ConflictError(f"{message}: {exc.diag.message_hint}" if exc.diag.message_hint else message)
    return exc


# request_execution_batch's DETAIL for an unknown action: format('request %s of %s', i, n).
_BATCH_ROW = re.compile(r"request (\d+) of \d+")


def _batch_row_ref(exc: psycopg.Error, refs: Sequence[str]) -> str:
    """The ref of the row a batch refused, from the row's position in the error's DETAIL
    (1-based, in ``refs``), not from the quoted literal in its message; "" if unknown."""
    found = _BATCH_ROW.fullmatch(exc.diag.message_detail or "")
    row = int(found[1]) if found else 0
    return refs[row - 1] if 0 < row <= len(refs) else ""


@contextmanager
def refusals(*, action_ref: str = "", target: str = "", refs: Sequence[str] = ()) -> Iterator[None]:
    """Raise a verb's refusal as its ConveyorError (works around sync and async calls alike).
    ``refs``: a request_execution_batch statement's refs (see translate)."""
    try:
        yield
    except psycopg.Error as exc:
        translated = translate(exc, action_ref=action_ref, target=target, refs=refs)
        if translated is exc:
            raise
        raise translated from None


# -- admission policies (the verbs: verbs/policies.py) --------------------------------------


def policy_not_found(target: str) -> NotFoundError:
    return NotFoundError(f"no admission policy for {target!r} (see `conveyor policies list`)")


# -- workflow executions (definitions: verbs/workflows.py) -------------------------------


def workflow_tree(workflow: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A workflow execution as ``executions get`` and ``/tree`` show it: its state and its
    task instances (oldest first; ties in definition order), without the definition."""
    order = {t["name"]: i for i, t in enumerate(workflow["definition"].get("tasks", []))}
    ranked = sorted(tasks, key=lambda t: (t["created"], t["iteration"], order.get(t["task"], len(order))))
    state = {k: v for k, v in workflow.items() if k not in ("definition", "id")}
    return {**state, "tasks": [dict(t) for t in ranked]}
