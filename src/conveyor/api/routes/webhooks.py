"""``/api/v1/webhooks``: the door (``POST /{name}``) and its administration.

The door is NOT behind the API's bearer tokens (a sender such as GitHub cannot send
them): each webhook's own auth decides (HMAC signature of the raw body, its own bearer
token, or none). It answers 202 with the event's id. In order: unknown or disabled ->
404 (the same answer for both); bearer token wrong -> 401; body over the limit (the
webhook's max_body_bytes and api.max_body_bytes, whichever is smaller) -> 413, before
anything is parsed; signature missing or wrong -> 401; not JSON -> 415 / 400; the
trigger's payload schema refuses it -> 422 with each path; the idempotency key reused
with another body -> 409. Nothing is stored unless the answer is 202.

Administration: viewers read; admins create, update, enable, disable and delete (as for
admission policies). Secrets are never answered, only whether one is set.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import psycopg
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from conveyor.api.auth import Admin, Viewer
from conveyor.api.context import ApiContext, context
from conveyor.api.errors import error
from conveyor.api.limits import INLINE_BYTES
from conveyor.api.routes.executions import ERRORS, WITH_BODY
from conveyor.api.webhook_schemas import (
    WebhookAccepted,
    WebhookDeleted,
    WebhookEnabled,
    WebhookIn,
    WebhookOut,
    WebhookRefusal,
    WebhookSaved,
)
from conveyor.domain import webhooks as door
from conveyor.domain.errors import ConflictError, InvalidPayloadError, NotFoundError
from conveyor.ops.metrics import WEBHOOK_REQUESTS
from conveyor.store.queries import Q
from conveyor.verbs import webhooks as hooks
from conveyor.verbs.drive import Verb, run_async

T = TypeVar("T")
router = APIRouter(prefix="/webhooks", tags=["webhooks"])
Ctx = Annotated[ApiContext, Depends(context)]
PREFIX = "/api/v1/webhooks/"
REPEATED_HEADER = "Idempotent-Replayed"


def _r(description: str) -> dict[str, Any]:
    return {"model": WebhookRefusal, "description": description}


DOOR_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "never: accepted events answer 202"},
    202: {"model": WebhookAccepted, "description": f"the event's id (a repeat: the first one, {REPEATED_HEADER})"},
    400: _r("not JSON, or an invalid idempotency key"),
    401: _r("the webhook's own auth failed: signature or bearer token missing or wrong"),
    404: _r("no such webhook, or it is disabled"),
    409: _r("the idempotency key was already used for another body"),
    413: _r("body over the webhook's max_body_bytes or api.max_body_bytes"),
    415: _r("not JSON (nor GitHub's form encoding)"),
    422: _r("the payload does not satisfy the trigger's payload schema (problems: each path)"),
    503: _r("database unavailable; retry later"),
}
DOOR_BODY = {"requestBody": {"content": {"application/json": {"schema": {}}}, "required": True}}
WITH_CONFLICT: dict[int | str, dict[str, Any]] = {
    **WITH_BODY,
    409: _r("the trigger exists with another type"),
    422: _r("the definition cannot be stored"),
}


# -- the door -------------------------------------------------------------------------------


async def _read(request: Request, limit: int) -> bytes:
    """The raw body, refused (413) as soon as it passes ``limit``: never read whole first."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise door.Refusal(413, f"request body too large: this webhook takes at most {limit} bytes")
    chunks: list[bytes] = []
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise door.Refusal(413, f"request body too large: this webhook takes at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _accept(request: Request, ctx: ApiContext, hook: dict[str, Any]) -> JSONResponse:
    if hook["auth"] == "bearer" and not door.bearer_ok(hook["token_hash"], request.headers.get("authorization")):
        raise door.Refusal(401, "missing or wrong bearer token for this webhook")
    body = await _read(request, min(hook["max_body_bytes"], ctx.settings.api.max_body_bytes))
    if hook["auth"] == "hmac":
        sent = request.headers.get(hook["signature_header"])
        if not door.signature_ok(hook["secret"], body, hook["signature_prefix"], sent):
            which = "missing" if sent is None else "wrong"
            raise door.Refusal(
                401,
                f"{which} signature: {hook['signature_header']} must be "
                f"{hook['signature_prefix']}<HMAC-SHA256 of the body, hex>",
            )
    args = (body, request.headers.get("content-type"), ctx.settings.documents.limits())
    # Megabytes of JSON are CPU work: off the event loop, which answers /health/live.
    value = door.parse_body(*args) if len(body) <= INLINE_BYTES else await run_in_threadpool(door.parse_body, *args)
    key = door.idempotency_key(request.headers.get(hook["idempotency_header"]))
    payload = {"body": value, "headers": door.kept_headers(request.headers, hook["idempotency_header"])}
    problems = door.check_payload(hook["payload_schema"], payload)
    if problems:
        text = "; ".join(f"{p['path']}: {p['message']}" for p in problems)
        return error(422, f"invalid payload for trigger {hook['trigger']}: {text}", problems=problems)
    async with ctx.pool.connection() as conn:
        row = await run_async(conn, hooks.emit(hook["trigger"], payload, key))
    answer = {"event_id": row["event_id"], "trigger": hook["trigger"], "repeated": row["repeated"]}
    return JSONResponse(answer, status_code=202, headers={REPEATED_HEADER: "true"} if row["repeated"] else None)


@router.post(
    "/{name}", status_code=202, response_model=WebhookAccepted, responses=DOOR_RESPONSES, openapi_extra=DOOR_BODY
)
async def receive(name: str, request: Request, ctx: Ctx) -> JSONResponse:
    """The door: authenticated by the webhook's own auth (not the API's tokens). Emits one
    event ``{"body": <JSON body>, "headers": {...}}`` (source ``webhook``) on its trigger;
    a retry with the same idempotency header value answers the same event."""
    label, response = "unknown", None
    try:
        hook = None
        if door.valid_name(name):  # an impossible name names nothing: the same 404
            async with ctx.pool.connection() as conn:  # not held while the body arrives
                hook = await (await conn.execute(Q["webhook_door"], {"name": name})).fetchone()
        if hook is None:
            raise door.Refusal(404, f"no webhook {name!r}")
        label = hook["name"]
        response = await _accept(request, ctx, hook)
    except door.Refusal as exc:
        response = error(exc.status, exc.message)
    except StarletteHTTPException as exc:  # api.max_body_bytes passed while streaming (limits.py)
        response = error(exc.status_code, str(exc.detail))
    except ConflictError as exc:
        response = error(409, str(exc))
    except NotFoundError:  # the trigger went away since the lookup (deleted meanwhile)
        response = error(404, f"no webhook {name!r}")
    except InvalidPayloadError as exc:  # the database's own check (a subset of the schema)
        response = error(422, str(exc), problems=[{"path": "payload", "message": m} for m in exc.problems])
    except psycopg.errors.DataError as exc:  # a value jsonb refuses, which the checks let through
        response = error(400, f"invalid value in the body: {exc.diag.message_primary or exc}")
    finally:
        # Bounded labels: a registered webhook's name, else "unknown". An exception here
        # (a database outage: 503 from the API's handler) counts as 503.
        WEBHOOK_REQUESTS.labels(label, str(response.status_code if response is not None else 503)).inc()
    return response


# -- administration --------------------------------------------------------------------------


def _out(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "url": PREFIX + row["name"]}


async def _run(ctx: ApiContext, verb: Verb[T]) -> T:
    """A webhook verb on a pool connection: its transaction, its refusals as errors."""
    async with ctx.pool.connection() as conn:
        return await run_async(conn, verb)


@router.get("", response_model=list[WebhookOut], responses=ERRORS)
async def list_webhooks(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    """Every webhook (whether a secret or token is set, never the value)."""
    async with ctx.pool.connection() as conn:
        return [_out(r) for r in await (await conn.execute(Q["list_webhooks"])).fetchall()]


@router.get("/{name}", response_model=WebhookOut, responses=ERRORS)
async def get_webhook(name: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    return _out(await _run(ctx, hooks.read(name)))


@router.put("/{name}", response_model=WebhookSaved, responses=WITH_CONFLICT)
async def put_webhook(name: str, body: WebhookIn, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Create or update the webhook and its trigger (type ``webhook``) together."""
    if body.generate_secret and (body.secret is not None or body.auth != "hmac"):
        raise HTTPException(422, "generate_secret is for auth hmac without a secret")
    secret = door.new_secret() if body.generate_secret else body.secret
    fields = body.model_dump(exclude={"auth", "secret", "generate_secret"})
    try:
        saved = await _run(ctx, hooks.register(name, auth=body.auth, secret=secret, **fields))
    except door.InvalidWebhookError as exc:
        raise HTTPException(422, str(exc)) from None
    return {**_out(saved), "secret": secret if body.generate_secret else None}


@router.delete("/{name}", response_model=WebhookDeleted, responses=ERRORS)
async def delete_webhook(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Delete it (its door answers 404); its events are kept."""
    await _run(ctx, hooks.delete(name))
    return {"name": name, "deleted": True}


@router.post("/{name}/enable", response_model=WebhookEnabled, responses=ERRORS)
async def enable_webhook(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    return await _run(ctx, hooks.set_enabled(name, True))


@router.post("/{name}/disable", response_model=WebhookEnabled, responses=ERRORS)
async def disable_webhook(name: str, ctx: Ctx, _: Admin) -> dict[str, Any]:
    """Its door answers 404 (as for an unknown webhook) until enabled again."""
    return await _run(ctx, hooks.set_enabled(name, False))
