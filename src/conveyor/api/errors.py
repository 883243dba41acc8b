"""Every error is JSON ``{"error": "<what is wrong>"}`` with a 4xx status that says whose
fault it is; a 500 would be a bug. A database outage is a 503 the client may retry."""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    ExecutionNotFoundError,
    ForbiddenError,
    InvalidAnswerError,
    InvalidParametersError,
    InvalidPayloadError,
    InvalidRuleError,
    InvalidTriggerError,
    InvalidWorkflowError,
    NotFoundError,
    UnknownActionError,
)
from conveyor.domain.schedules import InvalidScheduleError
from conveyor.domain.storable import clean_text
from conveyor.store.db import log_operational, rolled_back

log = structlog.get_logger(__name__)


class ClientGoneError(Exception):
    """The client hung up before its request was done: what it asked is rolled back, since
    it cannot learn the outcome (and may be retrying)."""


def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(_shown({"error": message, **extra}), status_code=status, headers=headers)


def _shown(value: Any) -> Any:
    """A refusal quotes what the client sent, which may hold a lone surrogate (a \\ud800
    escape in its JSON): not UTF-8, so the response itself could not be written (a 500).
    Shown as the escape text, as diagnostics are (domain.storable.clean_text)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {_shown(k): _shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(v) for v in value]
    return value


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = list(exc.errors())
        if any(p.get("type") == "json_invalid" for p in problems):
            detail = next(p for p in problems if p.get("type") == "json_invalid").get("ctx", {}).get("error", "")
            return error(400, f"malformed JSON body: {detail}".rstrip(": "))
        text = "; ".join(f"{_field(tuple(p.get('loc', ())))}: {p.get('msg', 'invalid')}" for p in problems)
        return error(
            422,
            f"invalid request: {text}",
            problems=[{"field": _field(tuple(p.get("loc", ()))), "message": p.get("msg", "")} for p in problems],
        )

    @app.exception_handler(ConveyorError)
    async def conveyor_error(request: Request, exc: ConveyorError) -> JSONResponse:
        if isinstance(exc, ExecutionNotFoundError | NotFoundError):
            return error(404, str(exc))
        if isinstance(exc, ConflictError):
            return error(409, str(exc))
        if isinstance(exc, InvalidWorkflowError | InvalidRuleError):  # every problem, each with its path
            problems = [{"path": path, "message": message} for _, path, message in exc.problems]
            return error(422, str(exc), problems=problems)
        if isinstance(exc, ForbiddenError):
            return error(403, str(exc))
        if isinstance(exc, InvalidAnswerError):
            return error(422, str(exc), problems=[{"field": f, "message": m} for f, m in exc.problems])
        if isinstance(exc, InvalidPayloadError):
            return error(422, str(exc), problems=[{"field": "payload", "message": m} for m in exc.problems])
        if isinstance(exc, UnknownActionError | InvalidParametersError | InvalidScheduleError | InvalidTriggerError):
            return error(422, str(exc))
        return error(400, str(exc))

    @app.exception_handler(psycopg.OperationalError)
    async def database_down(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        # Also the pool's PoolTimeout: no connection within api.database_timeout.
        log_operational(log, "API request", exc, path=request.url.path)
        retry_after = request.app.state.ctx.settings.api.retry_after
        # Retryable either way; only the words differ: a deadlock is not an outage.
        message = (
            "the database rolled this request back (deadlock or serialization failure); retry"
            if rolled_back(exc)
            else "database unavailable; retry later"
        )
        return error(503, message, headers={"Retry-After": str(retry_after)})

    @app.exception_handler(ClientGoneError)
    async def client_gone(request: Request, exc: ClientGoneError) -> JSONResponse:
        log.info("request abandoned by its client; rolled back", request=str(exc))
        return error(499, "client closed the request; nothing was done")  # nobody reads it: nginx's 499

    @app.exception_handler(psycopg.errors.DataError)
    async def bad_value(request: Request, exc: psycopg.errors.DataError) -> JSONResponse:
        # Values the checks above let through but PostgreSQL cannot store (e.g. NUL in text,
        # NaN in JSON): its detail says which ('Token "NaN" is invalid.').
        detail = f" ({exc.diag.message_detail})" if exc.diag.message_detail else ""
        return error(422, f"invalid value: {exc.diag.message_primary or exc}{detail}")
