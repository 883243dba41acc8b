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
from datetime import datetime
from typing import Any

import psycopg

from conveyor.actions.registry import AdmissionPolicy
from conveyor.domain import inquiries as inq
from conveyor.domain.delays import DelayError, check_aware
from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    ForbiddenError,
    InvalidAnswerError,
    InvalidParametersError,
    InvalidPayloadError,
    InvalidPolicyError,
    NotFoundError,
    UnknownActionError,
)
from conveyor.domain.storable import storable_problems
from conveyor.workflows.graph import graph
from conveyor.workflows.spec import WorkflowSpec

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

# admission_policy.target's CHECK, plus a length bound (a huge key would not fit its index).
_TARGET = re.compile(r"\*|[A-Za-z0-9_-]+|[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+")
_TARGET_MAX = 255


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


# -- workers ----------------------------------------------------------------------------


def worker_changed(name: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``cordon_worker`` / ``drain_worker`` answered (no row: no such worker)."""
    if row is None:
        raise NotFoundError(f"no worker named {name!r} (see `conveyor workers list`)")
    return dict(row)


# -- admission policies -----------------------------------------------------------------


def valid_policy_target(target: str) -> bool:
    return isinstance(target, str) and len(target) <= _TARGET_MAX and _TARGET.fullmatch(target) is not None


def policy_spec(target: str, concurrency: int, parameters: Sequence[str], method: str) -> AdmissionPolicy:
    """The checked policy for ``set``; InvalidPolicyError says what is wrong."""
    if not valid_policy_target(target):
        raise InvalidPolicyError(
            f"invalid policy target {target!r}: give an action ref (pack.name), a pack (pack) or '*' (every action)"
        )
    params = tuple(parameters) if isinstance(parameters, list | tuple) else parameters  # else refused below
    try:
        return AdmissionPolicy(concurrency, params, method)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidPolicyError(f"invalid policy for {target}: {exc}") from None


def policy_not_found(target: str) -> NotFoundError:
    return NotFoundError(f"no admission policy for {target!r} (see `conveyor policies list`)")


def policy_found(target: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    if row is None:
        raise policy_not_found(target)
    return dict(row)


# -- workflows (definitions: workflows/registration.py) -----------------------------------


def workflow_found(
    ref: str, version: int | None, row: Mapping[str, Any] | None, versions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A ``get_workflow`` row with its ``versions`` and ``graph`` (nodes, edges)."""
    if row is None:
        which = f"version {version} of " if version is not None and versions else ""
        raise NotFoundError(f"no {which}workflow {ref!r} (see `conveyor workflows list`)")
    spec = WorkflowSpec.from_json(row["definition"])
    return {**row, "versions": [dict(v) for v in versions], "graph": graph(spec).to_json()}


def workflow_deleted(ref: str, row: Mapping[str, Any] | None) -> int:
    """What ``delete_workflow`` answered: the versions deleted (none: no such workflow)."""
    if row is None or not row["versions"]:
        raise NotFoundError(f"no workflow {ref!r} (see `conveyor workflows list`)")
    return int(row["versions"])


def workflow_tree(workflow: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A workflow execution as ``executions get`` and ``/tree`` show it: its state and its
    task instances (oldest first; ties in definition order), without the definition."""
    order = {t["name"]: i for i, t in enumerate(workflow["definition"].get("tasks", []))}
    ranked = sorted(tasks, key=lambda t: (t["created"], t["iteration"], order.get(t["task"], len(order))))
    state = {k: v for k, v in workflow.items() if k not in ("definition", "id")}
    return {**state, "tasks": [dict(t) for t in ranked]}


# -- inquiries ---------------------------------------------------------------------------


def inquiry_not_found(inquiry_id: int) -> NotFoundError:
    return NotFoundError(f"no inquiry with id {inquiry_id} (see `conveyor inquiries list`)")


def check_answer(inquiry_id: int, schema: Mapping[str, Any], data: Any) -> None:
    """The answer against the inquiry's JSON Schema, before ``respond_inquiry``:
    InvalidAnswerError names the path of every problem."""
    # What jsonb cannot hold ({"r": "a\u0000b"}) first: a schema may well accept it.
    problems = list(storable_problems(data, "data")) or inq.answer_problems(schema, data)
    if problems:
        raise InvalidAnswerError(inquiry_id, problems)


def responded(inquiry_id: int, responder: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``respond_inquiry`` answered: ``answered`` or ``recorded`` (with the inquiry's
    status and responders so far), else the refusal as the error to show."""
    outcome = row["outcome"] if row else inq.NOT_FOUND
    if outcome == inq.NOT_FOUND or row is None:
        raise inquiry_not_found(inquiry_id)
    if outcome == inq.NOT_PENDING:
        raise ConflictError(f"inquiry {inquiry_id} is {row['status']}: it takes no more answers")
    if outcome == inq.NOT_ASSIGNEE:
        raise ForbiddenError(f"{responder!r} is not an assignee of inquiry {inquiry_id}")
    if outcome == inq.REQUESTER_FORBIDDEN:
        raise ForbiddenError(f"{responder!r} requested this execution and inquiry {inquiry_id} forbids its requester "
                             "to answer")  # fmt: skip
    if outcome == inq.ALREADY_RESPONDED:
        raise ConflictError(f"{responder!r} already answered inquiry {inquiry_id}: it needs another responder")
    return {"id": inquiry_id, "outcome": outcome, "status": row["status"], "execution": row["execution"],
            "responders": list(row["responders"] or [])}  # fmt: skip


# -- events (the checks of payloads and triggers: domain/events.py) ----------------------


def check_window(since: datetime, until: datetime | None) -> None:
    """A replay window: timezone-aware times, ``since`` before ``until``."""
    for what, when in (("since", since), ("until", until)):
        if when is not None:
            check_aware(when, what)
    if until is not None and until <= since:
        raise DelayError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})")
