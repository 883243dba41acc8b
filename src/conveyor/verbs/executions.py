"""Execution verbs: one body each, run by ``drive.run`` (SDK, CLI) and ``drive.run_async``
(API, the executors' retention duty). The SQL functions decide; what is here is the
checks made before them and what their answers mean. (On an application's own
connection, the SDK's ``request_execution(conn, ...)``, the schema is put on the
search_path around the verb: ``sdk.callers.in_callers_transaction``.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.domain.delays import DelayError, check_aware, check_delay
from conveyor.domain.errors import ConflictError, ExecutionNotFoundError, InvalidParametersError, UnknownActionError
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.domain.parameters import checker as problems_checker
from conveyor.domain.retention import RetentionError
from conveyor.domain.storable import unstorable
from conveyor.verbs.common import refusals
from conveyor.verbs.drive import Verb, sql

# -- requests ---------------------------------------------------------------------------


def request(
    action_ref: str,
    parameters: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    by: str | None = None,
    not_before: datetime | None = None,
    delay: timedelta | None = None,
) -> Verb[tuple[int, bool]]:
    """One execution in ``requested``: (its id, False); with idempotency ``key`` maybe an
    earlier request's: (that id, True). ``by``: the requester, set for the rest of the
    transaction (execution.requested_by). ``not_before`` or ``delay`` (from the database's
    now()): it waits until then. Refusals: UnknownActionError, InvalidParametersError (the
    full JSON Schema here, the database's subset there), ConflictError (a key reused)."""
    params = parameters or {}
    check_idempotency_key(key)
    _check_when(not_before, delay)
    action = yield sql("get_action", {"ref": action_ref})
    validate_parameters(action_ref, _parameters_schema(action_ref, action), params)
    if by is not None:
        yield sql("set_requested_by", {"by": by})
    with refusals(action_ref=action_ref):
        row = yield sql(
            "request_execution",
            {"ref": action_ref, "parameters": Jsonb(params), "key": key, "not_before": not_before, "delay": delay},
        )
    return int(row["execution_id"]), bool(row["repeated"])


def request_batch(
    requests: Sequence[tuple[str, dict[str, Any]]],
    *,
    not_before: datetime | None = None,
    delay: timedelta | None = None,
) -> Verb[list[int]]:
    """Many requests, all or none: their ids in request order, in few statements (one up
    to _BATCH_BYTES of JSON). Every row is checked as one request is (UnknownActionError,
    InvalidParametersError name the first refused row, in request order)."""
    _check_when(not_before, delay)
    if not requests:
        return []
    refs = list(dict.fromkeys(ref for ref, _ in requests))
    found = yield sql("action_schemas", {"refs": refs}, "all")
    actions = {r["ref"]: r for r in found}
    checks: dict[str, Callable[[Any], None]] = {}
    for ref, params in requests:
        check = checks.get(ref)
        if check is None:
            check = checks[ref] = parameters_checker(ref, _parameters_schema(ref, actions.get(ref)))
        check(params)
    ids: list[int] = []
    for chunk_refs, document in _chunks(requests):
        # A refusal by the database (CVA01, CVA02) names its row by its position in the
        # statement's refs.
        with refusals(refs=chunk_refs):
            rows = yield sql(
                "request_execution_batch",
                {"refs": chunk_refs, "not_before": not_before, "delay": delay, "parameters": document},
                "all",
            )
        ids.extend(int(r["id"]) for r in rows)
    return ids


def _parameters_schema(action_ref: str, action: Mapping[str, Any] | None) -> dict[str, Any]:
    """The schema of the action as read (None: no such action), for the full check."""
    if action is None:
        raise UnknownActionError(action_ref)
    return dict(action["parameters_schema"])


def _check_when(not_before: datetime | None, delay: timedelta | None) -> None:
    if not_before is not None and delay is not None:
        raise DelayError("give not_before or delay, not both")
    if not_before is not None:
        check_aware(not_before)
    if delay is not None:
        check_delay(delay)


# A statement's JSON stays far below jsonb's 255 MB limit and bounds the memory of both ends.
_BATCH_BYTES = 32 * 1024 * 1024
_BLOCK_ROWS = 10_000


def _chunks(requests: Sequence[tuple[str, dict[str, Any]]]) -> Iterator[tuple[list[str], str]]:
    """(refs, one JSON array of their parameters) per statement: blocks of _BLOCK_ROWS
    encoded at once, joined while under _BATCH_BYTES. One document for the server to parse
    per statement: measured 6-8x cheaper than a jsonb[] of as many elements, and cheaper
    than COPY into a staging table (docs/performance.md)."""
    refs: list[str] = []
    parts: list[str] = []
    size = 0
    for start in range(0, len(requests), _BLOCK_ROWS):
        block = requests[start : start + _BLOCK_ROWS]
        encoded = json.dumps([params for _, params in block])[1:-1]
        if parts and size + len(encoded) > _BATCH_BYTES:
            yield refs, "[" + ",".join(parts) + "]"
            refs, parts, size = [], [], 0
        refs.extend(ref for ref, _ in block)
        parts.append(encoded)
        size += len(encoded)
    if parts:
        yield refs, "[" + ",".join(parts) + "]"


# -- the full JSON Schema check of a request's parameters ------------------------------


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
    """validate_parameters for many documents of one action (domain.parameters.checker:
    built once), raising InvalidParametersError with every problem."""
    problems_of = problems_checker(parameters_schema)

    def check(document: Any) -> None:
        if problems := problems_of(document):
            raise InvalidParametersError(action_ref, problems)

    return check


def rerun(execution_id: int, *, from_failed: bool, by: str, requested_by: str | None = None) -> Verb[int]:
    """The new execution's id. ``from_failed``: ``rerun_execution`` -- a failed (or
    cancelled) workflow from its failed tasks, keeping what completed (``by`` in its rerun
    event); NotFoundError for no workflow execution, ConflictError for one that did not end
    badly. Else a new request of the same action with the same parameters, checked as any
    request is, by ``requested_by``."""
    if from_failed:
        with refusals():
            row = yield sql("rerun_execution", {"id": execution_id, "from_failed": True, "by": by})
        return int(row["id"])  # the function returns an id or raises
    original = yield sql("get_execution", {"id": execution_id})
    if original is None:
        raise ExecutionNotFoundError(execution_id)
    new_id, _ = yield from request(original["action_ref"], original["parameters"], by=requested_by)
    return new_id


# -- state changes ----------------------------------------------------------------------
# One statement each: a driver given ``retries`` (database.verb_retries) runs it again
# after a deadlock with the executor (lock order: migrations 0034, 0036).


def cancel(execution_id: int, by: str, policy: str | None = None) -> Verb[str]:
    """``cancel_execution`` (or ``cancel_workflow`` with a children ``policy``): the new
    status, ``cancelled`` or ``canceling``; a finished execution is a ConflictError."""
    with refusals():
        if policy is None:
            row = yield sql("cancel_execution", {"id": execution_id, "by": by})
        else:
            row = yield sql("cancel_workflow", {"id": execution_id, "by": by, "policy": policy})
    return cancelled(execution_id, row)


def cancelled(execution_id: int, row: Mapping[str, Any] | None) -> str:
    """What ``cancel_execution`` answered: the new status (``cancelled``, or ``canceling``
    while its worker stops it); asking again while canceling is not an error. No row: no
    such execution; ``now`` NULL: it had finished (ConflictError)."""
    if row is None:
        raise ExecutionNotFoundError(execution_id)
    if row["now"] is None:
        raise ConflictError(f"execution {execution_id} is {row['was']}: nothing to cancel")
    return str(row["now"])


def pause(execution_id: int, by: str) -> Verb[str]:
    """``pause_execution``: no new task of the running workflow starts; children in flight
    finish. The new status; ConflictError for one not running."""
    with refusals():
        row = yield sql("pause_execution", {"id": execution_id, "by": by})
    return _workflow_changed(execution_id, "pause", row)


def resume(execution_id: int, by: str) -> Verb[str]:
    """``resume_execution`` of a paused workflow: the new status."""
    with refusals():
        row = yield sql("resume_execution", {"id": execution_id, "by": by})
    return _workflow_changed(execution_id, "resume", row)


_PAUSE_NEEDS = {"pause": "running", "resume": "paused"}


def _workflow_changed(execution_id: int, verb: str, row: Mapping[str, Any] | None) -> str:
    """No row: no such execution; ``now`` NULL: not a workflow in the status ``verb`` needs."""
    if row is None:
        raise ExecutionNotFoundError(execution_id)
    if row["now"] is None:
        raise ConflictError(
            f"execution {execution_id} is {row['was']}: only a {_PAUSE_NEEDS[verb]} workflow execution can {verb}"
        )
    return str(row["now"])


# -- retention --------------------------------------------------------------------------


def purge(older_than: float, statuses: Sequence[str] | None = None, batch: int = 1000) -> Verb[int]:
    """One batch of ``purge_executions`` (migration 0024): at most ``batch`` finished
    top-level executions (of ``statuses``, else every finished one) that ended more than
    ``older_than`` seconds ago, with their trees; how many executions it deleted (0: none
    left). The operator's purge and the executors' retention duty alike."""
    with _retention_refusals():
        row = yield sql("purge_executions", {"older_than": older_than, "statuses": statuses, "batch": batch})
    return int(row["purged"]) if row else 0


@contextmanager
def _retention_refusals() -> Iterator[None]:
    """The function's own checks of an age or a status, as the one line to show."""
    try:
        yield
    except psycopg.errors.InvalidParameterValue as exc:
        raise RetentionError(exc.diag.message_primary or str(exc)) from None
