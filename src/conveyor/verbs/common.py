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
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import jsonschema
import jsonschema_rs
import psycopg
import structlog

from conveyor.actions.registry import AdmissionPolicy
from conveyor.domain import inquiries as inq
from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    ExecutionNotFoundError,
    ForbiddenError,
    InvalidAnswerError,
    InvalidParametersError,
    InvalidPayloadError,
    InvalidPolicyError,
    NotFoundError,
    UnknownActionError,
)
from conveyor.domain.storable import storable_problems, unstorable
from conveyor.store.db import rolled_back

log = structlog.get_logger(__name__)
T = TypeVar("T")

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


# -- requests ---------------------------------------------------------------------------


def validate_parameters(action_ref: str, parameters_schema: dict[str, Any], parameters: Any) -> None:
    """Full JSON Schema, before the database's own subset check (validate_parameters in SQL),
    and what jsonb cannot hold (a NUL, a lone surrogate: a schema may well accept them). A
    batch (parameters_checker) leaves the latter to the database's refusal: walking every
    document would cost a 100,000-row batch more than its schema checks do."""
    problems = list(unstorable(parameters, "parameters"))
    if problems:
        raise InvalidParametersError(action_ref, problems)
    parameters_checker(action_ref, parameters_schema)(parameters)


def parameters_checker(action_ref: str, parameters_schema: dict[str, Any]) -> Callable[[Any], None]:
    """validate_parameters for many documents of one action: the validator is built once
    (building it per document was most of a 100,000-row batch's time). Where the schema
    uses no keyword whose meaning differs between engines (see _engines_agree), a valid
    document is recognised by jsonschema_rs (~1 us, against ~35 us for jsonschema); any
    document it refuses is judged, and its errors worded, by jsonschema, as for one request."""
    full = jsonschema.validators.validator_for(parameters_schema)(parameters_schema)
    fast = _fast_validator(parameters_schema)

    def check(parameters: Any) -> None:
        if fast is not None:
            try:
                if fast.is_valid(parameters):
                    return
            except (ValueError, TypeError):  # not a JSON document: jsonschema decides
                pass
        elif full.is_valid(parameters):
            return
        errors = sorted(full.iter_errors(parameters), key=lambda e: list(e.path))
        if errors:
            raise InvalidParametersError(
                action_ref, [f"{'.'.join(str(p) for p in e.path) or 'parameters'}: {e.message}" for e in errors]
            )

    return check


# Keywords whose meaning can differ between jsonschema and jsonschema_rs: regular
# expressions (Python's re against an ECMA-like engine), formats, and references (which
# might be fetched). A schema using any of them (even as a property name) is judged by
# jsonschema alone.
_ENGINE_SENSITIVE = frozenset({"pattern", "patternProperties", "format", "$ref", "$dynamicRef", "$recursiveRef"})


def _engines_agree(node: Any) -> bool:
    if isinstance(node, dict):
        return not (_ENGINE_SENSITIVE & node.keys()) and all(_engines_agree(v) for v in node.values())
    if isinstance(node, list):
        return all(_engines_agree(v) for v in node)
    return True


def _fast_validator(parameters_schema: dict[str, Any]) -> Any:
    if not _engines_agree(parameters_schema):
        return None
    try:
        return jsonschema_rs.validator_for(parameters_schema, validate_formats=False, offline=True)
    except Exception:  # a schema jsonschema_rs does not take: jsonschema alone
        return None


# -- cancel -----------------------------------------------------------------------------


def cancelled(execution_id: int, row: Mapping[str, Any] | None) -> str:
    """What ``cancel_execution`` answered: the new status (``cancelled``, or ``canceling``
    while its worker stops it); asking again while canceling is not an error. No row: no
    such execution; ``now`` NULL: it had finished (ConflictError)."""
    if row is None:
        raise ExecutionNotFoundError(execution_id)
    if row["now"] is None:
        raise ConflictError(f"execution {execution_id} is {row['was']}: nothing to cancel")
    return str(row["now"])


# -- rolled back by the database --------------------------------------------------------
# A verb's transaction that PostgreSQL rolled back to break a deadlock (40P01) or a
# serialization failure (40001) did nothing, and running it again is the cure: the other
# side went on once this one was aborted. Lock order keeps these rare (migration 0034 for
# the cancel, 0036 for pause and resume); what it cannot exclude is retried here, once for every caller, so that a
# user's verb does not fail on a race with the executor. No pause between attempts: the
# next one queues behind the winner's locks. Past ``retries`` the error goes to the caller
# (the API answers 503, the CLI one line).


def retried(attempt: Callable[[], T], retries: int, verb: str) -> T:
    """``attempt`` (one whole transaction) run again, up to ``retries`` more times, while
    the database rolls it back (deadlock, serialization failure)."""
    for n in range(retries + 1):
        try:
            return attempt()
        except psycopg.OperationalError as exc:
            if not rolled_back(exc) or n == retries:
                raise
            _log_retry(verb, exc, n + 1, retries)
    raise AssertionError("unreachable")  # pragma: no cover (the loop returns or raises)


async def retried_async(attempt: Callable[[], Awaitable[T]], retries: int, verb: str) -> T:
    """:func:`retried` for an async caller."""
    for n in range(retries + 1):
        try:
            return await attempt()
        except psycopg.OperationalError as exc:
            if not rolled_back(exc) or n == retries:
                raise
            _log_retry(verb, exc, n + 1, retries)
    raise AssertionError("unreachable")  # pragma: no cover


def _log_retry(verb: str, exc: psycopg.Error, retry: int, retries: int) -> None:
    log.info("verb rolled back by the database (deadlock or serialization failure); running it again",
             verb=verb, sqlstate=exc.sqlstate, retry=retry, retries=retries)  # fmt: skip


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


# -- workflow executions (definitions: verbs/workflows.py) -------------------------------


_PAUSE_NEEDS = {"pause": "running", "resume": "paused"}


def workflow_changed(execution_id: int, verb: str, row: Mapping[str, Any] | None) -> str:
    """What ``pause_execution`` / ``resume_execution`` answered: the new status. No row:
    no such execution; ``now`` NULL: not a workflow in the status the verb needs."""
    if row is None:
        raise ExecutionNotFoundError(execution_id)
    if row["now"] is None:
        raise ConflictError(
            f"execution {execution_id} is {row['was']}: only a {_PAUSE_NEEDS[verb]} workflow execution can {verb}"
        )
    return str(row["now"])


def rerun_started(execution_id: int, row: Mapping[str, Any] | None) -> int:
    assert row is not None  # the function returns an id or raises
    return int(row["id"])


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
