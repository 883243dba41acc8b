"""Triggers and events (issue #13): the checks every door (SDK, API, CLI) makes before
``register_trigger`` and ``emit_event_once``, written once. The database checks a subset
of JSON Schema itself (validate_parameters); these check all of it, name every problem's
path, and refuse what jsonb cannot store (NUL characters, lone surrogates) with a message
instead of a driver error."""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from conveyor.domain.errors import InvalidPayloadError, InvalidTriggerError, NotFoundError
from conveyor.domain.ids import is_id
from conveyor.domain.storable import unstorable  # the one check of what PostgreSQL can store

# trigger.name's CHECK (migration 0016).
NAME_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$"
NAME_MAX = 255
_NAME = re.compile(NAME_PATTERN)
ENFORCEMENT_OUTCOMES = ("requested", "template_error", "request_error", "rule_disabled")


def valid_trigger_name(name: object) -> bool:
    return isinstance(name, str) and len(name) <= NAME_MAX and _NAME.fullmatch(name) is not None


def trigger_not_found(name: str) -> NotFoundError:
    shown = name if len(name) <= 80 else name[:80] + "..."
    return NotFoundError(f"unknown trigger {shown!r}: register it first (conveyor triggers register)")


def event_not_found(event_id: int) -> NotFoundError:
    return NotFoundError(f"no event with id {event_id} (see `conveyor events list`)")


def enforcement_not_found(enforcement_id: int) -> NotFoundError:
    return NotFoundError(f"no enforcement with id {enforcement_id} (see `conveyor enforcements list`)")


def valid_id(value: int) -> bool:
    return is_id(value)


def check_trigger(name: str, payload_schema: Any, description: str | None = None) -> None:
    """A custom trigger that ``register_trigger`` can store: a valid name, and a payload
    schema that is a JSON object and a valid JSON Schema (None: any payload)."""
    if not valid_trigger_name(name):
        shown = repr(name[:80]) if isinstance(name, str) else type(name).__name__
        raise InvalidTriggerError(
            f"invalid trigger name {shown}: use letters, digits, '_', '-' and dots after the first part "
            f"(e.g. deploys or github.push), at most {NAME_MAX} characters"
        )
    if description is not None:
        problems = list(unstorable(description, "description"))
        if problems:
            raise InvalidTriggerError(f"trigger {name}: " + "; ".join(problems))
    if payload_schema is None:
        return
    if not isinstance(payload_schema, dict):
        raise InvalidTriggerError(f"payload schema of trigger {name}: must be a JSON object (a JSON Schema)")
    problems = list(unstorable(payload_schema, "payload_schema"))
    if problems:
        raise InvalidTriggerError(f"payload schema of trigger {name}: " + "; ".join(problems))
    cls = jsonschema.validators.validator_for(payload_schema)
    try:
        cls.check_schema(payload_schema)
    except jsonschema.SchemaError as exc:
        where = ".".join(str(p) for p in exc.path)
        raise InvalidTriggerError(
            f"payload schema of trigger {name} is not a valid JSON Schema: {where + ': ' if where else ''}{exc.message}"
        ) from None


def payload_problems(payload_schema: dict[str, Any] | None, payload: Any) -> list[str]:
    """Every problem with ``payload``, each with its path (``payload.ref``)."""
    problems = list(unstorable(payload, "payload"))
    if problems or payload_schema is None:
        return problems
    cls = jsonschema.validators.validator_for(payload_schema)
    errors = sorted(cls(payload_schema).iter_errors(payload), key=lambda e: [str(p) for p in e.path])
    return [".".join(["payload", *(str(p) for p in e.path)]) + f": {e.message}" for e in errors]


def check_payload(trigger: str, payload_schema: dict[str, Any] | None, payload: Any) -> None:
    problems = payload_problems(payload_schema, payload)
    if problems:
        raise InvalidPayloadError(trigger, problems)
