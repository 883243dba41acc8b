"""Admission policy verbs (an operator's: docs/runbook.md#admission-policies): set and
delete, each one SQL function (``set_admission_policy``, ``delete_admission_policy``,
migration 0009), run by ``drive.run`` (SDK, CLI) and ``drive.run_async`` (API). The
policy's checks (its target, limit, grouping and method) run before the first statement."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.actions.registry import AdmissionPolicy
from conveyor.domain.errors import InvalidPolicyError
from conveyor.verbs.common import policy_not_found, refusals
from conveyor.verbs.drive import Verb, sql

# admission_policy.target's CHECK, plus a length bound (a huge key would not fit its index).
_TARGET = re.compile(r"\*|[A-Za-z0-9_-]+|[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+")
_TARGET_MAX = 255

not_found = policy_not_found  # common.translate's too (CVN03): kept there


def valid_target(target: str) -> bool:
    return isinstance(target, str) and len(target) <= _TARGET_MAX and _TARGET.fullmatch(target) is not None


def spec(target: str, concurrency: int, parameters: Sequence[str], method: str) -> AdmissionPolicy:
    """The checked policy for ``set``; InvalidPolicyError says what is wrong."""
    if not valid_target(target):
        raise InvalidPolicyError(
            f"invalid policy target {target!r}: give an action ref (pack.name), a pack (pack) or '*' (every action)"
        )
    params = tuple(parameters) if isinstance(parameters, list | tuple) else parameters  # else refused below
    try:
        return AdmissionPolicy(concurrency, params, method)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidPolicyError(f"invalid policy for {target}: {exc}") from None


def get(target: str) -> Verb[dict[str, Any]]:
    """The policy as stored, with the slots it holds and the executions it keeps waiting
    (a read, shared by the verbs' answers). A target no policy can have names nothing."""
    row = (yield sql("get_policy", {"target": target})) if valid_target(target) else None
    return found(target, row)


def set_policy(
    target: str, concurrency: int, parameters: Sequence[str] = (), method: str = "enqueue"
) -> Verb[dict[str, Any]]:
    """Create or replace the operator policy for ``target`` (it wins over the action's
    own); answers it as stored. Waiters a higher limit allows are admitted by the
    database in the same transaction. InvalidPolicyError: the policy cannot be stored."""
    checked = spec(target, concurrency, parameters, method)
    yield sql("set_policy", {"target": target, **checked.to_json()})
    return (yield from get(target))


def delete_policy(target: str) -> Verb[dict[str, Any]]:
    """Delete the policy for ``target``: ``released`` (its waiters now schedulable) and
    ``restored`` (the action's own policy, back after deleting an operator's override).
    NotFoundError: none; ConflictError: the action's definition declares it."""
    if not valid_target(target):
        raise not_found(target)
    with refusals(target=target):
        deleted = yield sql("delete_policy", {"target": target})
    assert deleted is not None  # the function returns a row or raises
    restored = (yield from get(target)) if deleted["restored"] else None
    return {**deleted, "restored": restored}


def found(target: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    if row is None:
        raise not_found(target)
    return dict(row)
