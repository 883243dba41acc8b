"""Webhooks: what the door decides, as pure functions (no I/O), shared by the API's door,
its admin routes and the CLI.

The event a webhook emits has the payload ``{"body": <the JSON body>, "headers":
{<selected headers, lowercased names>}}`` -- the shape of StackStorm's
``core.st2.webhook``, so rules address ``trigger.body.x`` and
``trigger.headers['x-github-event']``. Only a fixed set of stable headers is kept (never
Authorization, cookies or the signature): a sender's retry must make the same payload, or
its idempotency key would be refused as reused (409).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import jsonschema

from conveyor.domain.documents import DEFAULT_LIMITS, DocumentError, Limits, load_json
from conveyor.domain.errors import ConveyorError

NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?")
NAME_MAX = 255
KEY_MAX = 255  # event.idempotency_key's CHECK
HEADER_VALUE_MAX = 1024
# Headers rules are likely to test (which event, which hook), kept in the payload; the
# webhook's idempotency header is kept too. Senders set them the same on every retry.
KEPT_HEADERS = (
    "content-type",
    "x-github-event",
    "x-github-hook-id",
    "x-github-hook-installation-target-id",
    "x-github-hook-installation-target-type",
    "x-gitlab-event",
    "x-event-key",
)
JSON_TYPES = ("", "application/json", "text/json", "text/plain")
FORM = "application/x-www-form-urlencoded"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class InvalidWebhookError(ConveyorError):
    """A webhook definition that cannot be stored; the message says why (HTTP 422)."""


@dataclass(frozen=True, slots=True)
class Refusal(Exception):
    """The door's answer to a request it does not accept: an HTTP status and a message."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


def valid_name(name: str) -> bool:
    return len(name) <= NAME_MAX and NAME.fullmatch(name) is not None


# -- secrets ------------------------------------------------------------------------------


def token_hash(token: str) -> str:
    """How a bearer token is kept (webhook.token_hash): its SHA-256, 64 hex digits."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_secret() -> str:
    """A shared HMAC secret of 256 random bits (URL-safe, so it pastes into any form)."""
    return secrets.token_urlsafe(32)


def bearer_ok(stored_hash: str, authorization: str | None) -> bool:
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return False
    return hmac.compare_digest(token_hash(value.strip()).encode(), stored_hash.encode())


def signature(secret: str, body: bytes, prefix: str = "sha256=") -> str:
    """The header value a sender computes: ``prefix`` + HMAC-SHA256(secret, raw body) in hex."""
    return prefix + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_ok(secret: str, body: bytes, prefix: str, sent: str | None) -> bool:
    """Constant-time check of the signature of the raw body (hex digits in any case)."""
    if sent is None:
        return False
    expected = signature(secret, body, prefix).lower().encode()
    return hmac.compare_digest(expected, sent.strip().lower().encode("utf-8", "replace"))


# -- the body -----------------------------------------------------------------------------


def _json(text: bytes, limits: Limits) -> Any:
    try:
        value = load_json(text.decode("utf-8"), limits)  # NaN, Infinity, 1e400: ValueError
    except UnicodeDecodeError:
        raise Refusal(400, "the body is not UTF-8") from None
    except DocumentError as exc:  # past the documents.* bounds, or a key named twice
        raise Refusal(400, f"JSON body refused: {exc}") from None
    except ValueError as exc:
        raise Refusal(400, f"malformed JSON body: {exc}") from None
    # What PostgreSQL's jsonb cannot hold: a lone UTF-16 surrogate (a NUL character, also
    # refused, is answered from the database's DataError: 400 as well).
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise Refusal(400, "the JSON body has a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    except RecursionError:
        raise Refusal(400, "the JSON body is nested too deeply") from None
    return value


def parse_body(body: bytes, content_type: str | None, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The JSON value of a body: JSON (any ``application/*+json`` too), or GitHub's form
    encoding (``payload=<url-encoded JSON>``). A form body that is not ``payload=`` is read
    as JSON, as ``curl -d '{...}'`` sends one. Anything else: 415. Read within ``limits``
    (the ``documents`` settings)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES and media != FORM and not media.endswith("+json"):
        raise Refusal(415, f"unsupported content type {media!r}: send JSON (application/json)")
    if not body.strip():
        raise Refusal(400, "empty body: a JSON value expected")
    if media == FORM and body.startswith(b"payload="):
        try:
            fields = parse_qs(body.decode("ascii"), strict_parsing=True, max_num_fields=1, errors="strict")
        except (UnicodeError, ValueError) as exc:
            raise Refusal(400, f"malformed form body: {exc}") from None
        if list(fields) != ["payload"] or len(fields["payload"]) != 1:
            raise Refusal(400, "a form body must have exactly one field, payload=<JSON>")
        return _json(fields["payload"][0].encode("utf-8", "surrogatepass"), limits)
    return _json(body, limits)


def kept_headers(headers: Any, idempotency_header: str) -> dict[str, str]:
    """The headers the event keeps (lowercased names; absent, empty, over-long or
    control-character values left out)."""
    kept: dict[str, str] = {}
    for name in (*KEPT_HEADERS, idempotency_header.lower()):
        value = headers.get(name)
        if value and len(value) <= HEADER_VALUE_MAX and not _CONTROL.search(value):
            kept[name] = value
    return kept


def idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value) <= KEY_MAX or "\x00" in value:
        raise Refusal(400, f"the idempotency key must have 1 to {KEY_MAX} characters")
    return value


def check_payload(schema: dict[str, Any] | None, payload: Any) -> list[dict[str, str]]:
    """Full JSON Schema (the database checks only a subset): every problem with its path
    in the payload (``body.repository.name``)."""
    if schema is None:
        return []
    try:
        cls = jsonschema.validators.validator_for(schema)
        found = sorted(cls(schema).iter_errors(payload), key=lambda e: [str(p) for p in e.path])
    except (jsonschema.SchemaError, jsonschema.exceptions.UnknownType) as exc:
        # A schema stored around register_webhook's check (register_trigger in SQL): no
        # payload can be checked against it, so none is accepted.
        raise Refusal(422, f"the trigger's payload schema is not valid JSON Schema: {exc}") from None
    return [{"path": ".".join(str(p) for p in e.path) or "payload", "message": e.message} for e in found]


# -- registration -------------------------------------------------------------------------


def check_schema(schema: Any) -> dict[str, Any] | None:
    """A payload schema a webhook may carry: a valid JSON Schema object (or None)."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise InvalidWebhookError("the payload schema must be a JSON object (a JSON Schema)")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidWebhookError(f"invalid payload schema: {exc.message}") from None
    return schema
