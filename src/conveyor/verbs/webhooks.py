"""Registering webhooks, as the API (async) and the CLI (sync) share it: the checks made
before ``register_webhook`` (migration 0017), its parameters, and what its refusals mean.
A caller is one ``execute`` of ``Q["register_webhook"]`` with ``registration(...)``
inside ``refusals()``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.domain.errors import NotFoundError
from conveyor.domain.storable import unstorable
from conveyor.domain.webhooks import InvalidWebhookError, check_schema, token_hash, valid_name
from conveyor.verbs import common as verbs

INVALID_WEBHOOK = "CVW01"  # register_webhook: the definition cannot be stored


def not_found(name: str) -> NotFoundError:
    return NotFoundError(f"no webhook {name!r} (see `conveyor webhooks list`)")


def registration(
    name: str,
    *,
    auth: str,
    trigger: str | None = None,
    secret: str | None = None,
    token: str | None = None,
    signature_header: str | None = None,
    signature_prefix: str | None = None,
    idempotency_header: str | None = None,
    max_body_bytes: int | None = None,
    description: str | None = None,
    payload_schema: Any = None,
) -> dict[str, Any]:
    """The parameters of ``Q["register_webhook"]``: the token hashed (never stored as
    given), the schema checked as JSON Schema. InvalidWebhookError says what is wrong."""
    if not valid_name(name):
        raise InvalidWebhookError(
            f"invalid webhook name {name!r}: letters, digits, _ and - (an optional dotted suffix), at most 255"
        )
    if token is not None and not token.strip():
        raise InvalidWebhookError("an empty bearer token")
    given = {"trigger": trigger, "secret": secret, "token": token, "signature_header": signature_header,
             "signature_prefix": signature_prefix, "idempotency_header": idempotency_header,
             "description": description, "payload_schema": payload_schema}  # fmt: skip
    problems = list(unstorable(given, ""))  # a NUL or a lone surrogate PostgreSQL would refuse
    if problems:
        raise InvalidWebhookError(f"webhook {name}: " + "; ".join(problems))
    return {
        "name": name,
        "trigger": trigger,
        "auth": auth,
        "token_hash": token_hash(token.strip()) if token is not None else None,
        "secret": secret,
        "signature_header": signature_header,
        "signature_prefix": signature_prefix,
        "idempotency_header": idempotency_header,
        "max_body_bytes": max_body_bytes,
        "description": description,
        "payload_schema": Jsonb(check_schema(payload_schema)) if payload_schema is not None else None,
    }


@contextmanager
def refusals() -> Iterator[None]:
    """register_webhook's refusals as errors a user can act on (CVW01: invalid; the
    trigger's CVC05: it exists with another type, a 409)."""
    try:
        with verbs.refusals():
            yield
    except psycopg.Error as exc:
        if exc.sqlstate == INVALID_WEBHOOK:
            message = exc.diag.message_primary or str(exc)
            hint = exc.diag.message_hint
            raise InvalidWebhookError(f"{message} ({hint})" if hint else message) from None
        raise
