"""How a retried pass names the OperationalError that ended it: a transaction the server
rolled back (deadlock, serialization failure) is not an outage."""

from __future__ import annotations

import psycopg
import pytest
import structlog
from structlog.testing import capture_logs

from conveyor.store.db import log_operational


@pytest.mark.parametrize(
    ("exc", "sqlstate"),
    [
        (psycopg.errors.DeadlockDetected("deadlock detected\n"), "40P01"),
        (psycopg.errors.SerializationFailure("could not serialize access"), "40001"),
    ],
)
def test_a_rollback_is_retried_not_an_outage(exc: psycopg.OperationalError, sqlstate: str) -> None:
    with capture_logs() as events:
        log_operational(structlog.get_logger("test"), "workflow pass", exc)
    assert events == [
        {
            "event": "workflow pass rolled back by the database (deadlock or serialization failure); retrying",
            "log_level": "info",
            "sqlstate": sqlstate,
            "error": str(exc).strip(),
        }
    ]


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection failed: connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    ],
)
def test_anything_else_is_the_database_unreachable(exc: psycopg.OperationalError) -> None:
    with capture_logs() as events:
        log_operational(structlog.get_logger("test"), "recovery duty", exc, duty="_sweep")
    assert events == [
        {
            "event": "recovery duty failed; database unreachable",
            "log_level": "warning",
            "error": str(exc).strip(),
            "duty": "_sweep",
        }
    ]


@pytest.mark.parametrize(
    ("exc", "message", "level"),
    [
        (psycopg.errors.DeadlockDetected("deadlock detected"),
         "the database rolled this request back (deadlock or serialization failure); retry", "info"),
        (psycopg.OperationalError("connection refused"), "database unavailable; retry later", "warning"),
    ],
)  # fmt: skip
async def test_the_api_tells_a_rolled_back_request_from_an_outage(
    exc: psycopg.OperationalError, message: str, level: str
) -> None:
    """Both are 503 with Retry-After (doing it again is the cure), in words that are true."""
    from types import SimpleNamespace

    import httpx
    from fastapi import FastAPI

    from conveyor.api import errors

    app = FastAPI()
    app.state.ctx = SimpleNamespace(settings=SimpleNamespace(api=SimpleNamespace(retry_after=2)))
    errors.install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise exc

    transport = httpx.ASGITransport(app=app)
    with capture_logs() as events:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/boom")
    assert (response.status_code, response.headers["Retry-After"]) == (503, "2")
    assert message in response.text
    assert [(e["log_level"], e["path"]) for e in events] == [(level, "/boom")]
