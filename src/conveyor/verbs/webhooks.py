"""Webhook verbs: one body each, run by ``drive.run`` (SDK, CLI through the SDK) and
``drive.run_async`` (API). Each is one SQL function: ``register_webhook`` (migration
0017), ``delete_webhook``, ``set_webhook_enabled``, and the door's ``emit_event_once``
(source ``webhook``). What is here is the checks made before it (the name, the token
hashed, the payload schema checked as JSON Schema) and what its answer or refusal means."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.domain.errors import NotFoundError
from conveyor.domain.storable import unstorable
from conveyor.domain.webhooks import InvalidWebhookError, check_schema, token_hash, valid_name
from conveyor.store.db import Row
from conveyor.verbs import common as verbs
from conveyor.verbs.drive import Verb, sql

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
    """The parameters of ``register_webhook``: the token hashed (never stored as
    given), the schema checked as JSON Schema. InvalidWebhookError says what is wrong."""
    if not valid_name(name):
        raise InvalidWebhookError(
            f"invalid webhook name {name!r}: letters, digits, _ and - (an optional dotted suffix), at most 255"
        )
    if token is not None and not token.strip():
        raise InvalidWebhookError("an empty bearer token")
    given = {
        "trigger": trigger,
        "secret": secret,
        "token": token,
        "signature_header": signature_header,
        "signature_prefix": signature_prefix,
        "idempotency_header": idempotency_header,
        "description": description,
        "payload_schema": payload_schema,
    }
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


# -- the verbs ----------------------------------------------------------------------------


def read(name: str) -> Verb[Row]:
    """One webhook as shown (never a secret: whether one is set). A read, also the
    answer of :func:`register`."""
    # An impossible name names nothing: not looked up.
    row = (yield sql("get_webhook", {"name": name})) if valid_name(name) else None
    if row is None:
        raise not_found(name)
    return dict(row)


def register(name: str, *, auth: str, **fields: Any) -> Verb[Row]:
    """``register_webhook``: create or update the webhook and its trigger (type
    ``webhook``) together; ``fields`` as :func:`registration` takes them. The webhook as
    :func:`read` shows it, with ``created_now``."""
    params = registration(name, auth=auth, **fields)
    with refusals():
        row = yield sql("register_webhook", params)
    assert row is not None  # the function answers a row or raises
    return {**(yield from read(name)), "created_now": row["created"]}


def delete(name: str) -> Verb[None]:
    """``delete_webhook``: its door answers 404; its events are kept."""
    row = (yield sql("delete_webhook", {"name": name})) if valid_name(name) else None
    if row is None or not row["deleted"]:
        raise not_found(name)


def set_enabled(name: str, enabled: bool) -> Verb[Row]:
    """``set_webhook_enabled``: ``{"name", "enabled", "was"}``; a disabled webhook's door
    answers 404, as an unknown one's."""
    row = (yield sql("set_webhook_enabled", {"name": name, "enabled": enabled})) if valid_name(name) else None
    if row is None:
        raise not_found(name)
    return {"name": name, "enabled": enabled, "was": row["was"]}


def emit(trigger: str, payload: Any, key: str | None) -> Verb[Row]:
    """The door's event (``emit_event_once``, source ``webhook``) on its trigger, the
    payload checked by the caller against the trigger's schema: ``{"event_id",
    "repeated"}`` (a repeat with the same key and body: the first event's id). A key
    reused with another body is a ConflictError; the trigger gone meanwhile, NotFoundError."""
    with refusals():
        row = yield sql("emit_webhook_event", {"trigger": trigger, "payload": Jsonb(payload), "key": key})
    assert row is not None  # the function answers a row or raises
    return dict(row)
