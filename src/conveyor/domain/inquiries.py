"""Inquiries (``core.ask``): the checks made around the SQL verbs, as pure functions.

An answer is checked against the inquiry's JSON Schema before ``respond_inquiry`` is
called (the database stores schemas but does not evaluate them); an ask is checked when
the executor claims it, so that an inquiry nobody could ever answer fails at once with
the reason instead of waiting for its ttl.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema

# The roles an assignee may name (api_token.role); any other assignee is a token name.
ROLES = ("viewer", "operator", "admin")

# What respond_inquiry answers (migration 0013).
ANSWERED, RECORDED = "answered", "recorded"
NOT_FOUND, NOT_PENDING, NOT_ASSIGNEE = "not_found", "not_pending", "not_assignee"
REQUESTER_FORBIDDEN, ALREADY_RESPONDED = "requester_forbidden", "already_responded"


def _path(parts: Iterable[Any]) -> str:
    return ".".join(["data", *(str(p) for p in parts)])


def answer_problems(schema: Mapping[str, Any], data: Any) -> list[tuple[str, str]]:
    """Every way ``data`` fails ``schema``, as (path, message), the path from ``data``
    (``data.approved``); empty when it is a valid answer."""
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    return [(_path(e.absolute_path), e.message) for e in errors]


def ask_problems(parameters: Mapping[str, Any]) -> list[str]:
    """Why an ask (core.ask's parameters, already valid against its own schema) could
    never be answered: a ``schema`` that is not a JSON Schema, a default answer that it
    refuses, fewer possible responders than the quorum. Empty: it can be asked."""
    schema = parameters.get("schema", {})
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        return [f"schema{'.' + where if where else ''}: not a valid JSON Schema: {exc.message}"]
    problems: list[str] = []
    on_timeout = parameters.get("on_timeout", "fail")
    if isinstance(on_timeout, dict) and "default" in on_timeout:
        problems += [
            f"on_timeout.default: not a valid answer ({path}: {message})"
            for path, message in answer_problems(schema, on_timeout["default"])
        ]
    assignees = set(parameters.get("assignees", []))
    quorum = int(parameters.get("quorum", 1))
    if assignees and not assignees & set(ROLES) and len(assignees) < quorum:
        problems.append(f"quorum: {quorum} distinct responders needed but only {len(assignees)} assignees named")
    return problems
