"""Inquiry verbs (docs/inquiries.md): respond, one SQL function (``respond_inquiry``,
migration 0014), run by ``drive.run`` (SDK, CLI) and ``drive.run_async`` (API). The
database stores an inquiry's JSON Schema but does not evaluate it: the answer is checked
here, between reading the schema and the call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain import inquiries as inq
from conveyor.domain.errors import ConflictError, ForbiddenError, InvalidAnswerError, NotFoundError
from conveyor.domain.ids import is_id
from conveyor.domain.storable import storable_problems
from conveyor.verbs.drive import Verb, sql


def not_found(inquiry_id: int) -> NotFoundError:
    return NotFoundError(f"no inquiry with id {inquiry_id} (see `conveyor inquiries list`)")


def respond(inquiry_id: int, data: Any, *, responder: str, role: str) -> Verb[dict[str, Any]]:
    """Answer the inquiry as ``responder`` with ``role``: ``outcome`` answered (the quorum
    is reached: the asking execution completed) or recorded (more responders needed),
    with its ``status`` and ``responders``. Refusals: InvalidAnswerError (the schema, each
    problem's path), NotFoundError, ForbiddenError (not an assignee; the forbidden
    requester), ConflictError (not pending any more; this responder answered already)."""
    found = (yield sql("inquiry_schema", {"id": inquiry_id})) if is_id(inquiry_id) else None
    if found is None:
        raise not_found(inquiry_id)
    check_answer(inquiry_id, found["schema"], data)
    params = {"id": inquiry_id, "responder": responder, "role": role, "data": Jsonb(data)}
    row = yield sql("respond_inquiry", params)
    return responded(inquiry_id, responder, row)


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
        raise not_found(inquiry_id)
    if outcome == inq.NOT_PENDING:
        raise ConflictError(f"inquiry {inquiry_id} is {row['status']}: it takes no more answers")
    if outcome == inq.NOT_ASSIGNEE:
        raise ForbiddenError(f"{responder!r} is not an assignee of inquiry {inquiry_id}")
    if outcome == inq.REQUESTER_FORBIDDEN:
        raise ForbiddenError(
            f"{responder!r} requested this execution and inquiry {inquiry_id} forbids its requester to answer"
        )
    if outcome == inq.ALREADY_RESPONDED:
        raise ConflictError(f"{responder!r} already answered inquiry {inquiry_id}: it needs another responder")
    return {
        "id": inquiry_id,
        "outcome": outcome,
        "status": row["status"],
        "execution": row["execution"],
        "responders": list(row["responders"] or []),
    }
