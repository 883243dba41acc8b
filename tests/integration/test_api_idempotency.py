"""Integration: ``POST /api/v1/executions`` with an ``Idempotency-Key`` (201 once, then 200
with the same execution; 409 for the key reused with another body; 422 for an unusable
key), a request whose client hung up is rolled back, and a request that cannot get a
database connection is answered 503 after ``api.database_timeout``, not the pool's 30 s."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.api.app import create_app
from conveyor.api.auth import Role, create_token
from conveyor.config import Settings
from conveyor.store.db import make_pool
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import Api, error_of

BODY = {"action_ref": "core.echo", "parameters": {"message": "once"}}
# A bound on behaviour, not a benchmark: far above api.database_timeout, far below 30 s.
PROMPT = 5.0


async def make_api(settings: Settings, pool: AsyncConnectionPool[Any], db_url: str) -> AsyncIterator[Api]:
    app = create_app(settings, pool, PostgresTransport(db_url, "conveyor"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        api = Api(app, client, pool)
        async with pool.connection() as conn:
            api.tokens["operator"], _ = await create_token(conn, "test operator", Role.operator)
        yield api


@pytest.fixture
async def api(pool: AsyncConnectionPool[Any], db_url: str) -> AsyncIterator[Api]:
    async for made in make_api(Settings(), pool, db_url):
        yield made


def keyed(key: str | bytes) -> dict[str, Any]:
    return {"headers": {"Idempotency-Key": key}}


async def executions(api: Api) -> list[int]:
    return [r["id"] for r in await api.sql("SELECT id FROM execution ORDER BY id")]


async def test_same_key_201_then_200_with_the_same_execution(api: Api) -> None:
    first = await api.post("/api/v1/executions", json=BODY, **keyed("order-1"))
    assert first.status_code == 201, first.text
    again = await api.post("/api/v1/executions", json=BODY, **keyed("order-1"))
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    # A retry of the seeds' form-encoded curl body is the same request.
    form = await api.post(
        "/api/v1/executions",
        content=json.dumps(BODY),
        headers={"Content-Type": "application/x-www-form-urlencoded", "idempotency-key": "order-1"},
    )
    assert form.status_code == 200, form.text
    assert form.json()["id"] == first.json()["id"]
    other = await api.post("/api/v1/executions", json=BODY, **keyed("order-2"))
    assert other.status_code == 201, other.text
    assert await executions(api) == [first.json()["id"], other.json()["id"]]


async def test_without_a_key_every_post_is_a_new_execution(api: Api) -> None:
    ids = [(await api.post("/api/v1/executions", json=BODY)).json()["id"] for _ in range(2)]
    assert len(set(ids)) == 2
    assert await executions(api) == ids


@pytest.mark.parametrize(
    "body",
    [
        {"action_ref": "core.echo", "parameters": {"message": "twice"}},
        {"action_ref": "core.noop", "parameters": {}},
    ],
)
async def test_a_key_reused_for_another_request_is_409(api: Api, body: dict[str, Any]) -> None:
    first = await api.post("/api/v1/executions", json=BODY, **keyed("order-1"))
    assert first.status_code == 201, first.text
    refused = await api.post("/api/v1/executions", json=body, **keyed("order-1"))
    message = error_of(refused, 409)
    assert f"'order-1' was already used for another request (execution {first.json()['id']})" in message
    assert await executions(api) == [first.json()["id"]]


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9".encode(), b"bell\x07", b"\xff"])
async def test_an_unusable_key_is_422(api: Api, key: str | bytes) -> None:
    refused = await api.post("/api/v1/executions", json=BODY, **keyed(key))
    assert "Idempotency-Key" in error_of(refused, 422)
    assert await executions(api) == []


async def test_the_openapi_document_describes_the_header_and_answers(api: Api) -> None:
    operation = (await api.client.get("/api/v1/openapi.json")).json()["paths"]["/api/v1/executions"]["post"]
    [header] = [p for p in operation["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key"
    assert header["required"] is False
    assert {"200", "201", "409", "422", "503"} <= set(operation["responses"])


async def test_a_post_whose_client_hung_up_is_not_committed(api: Api) -> None:
    """The client is gone by the time the execution would commit (it gave up waiting):
    rolled back, so that its retry does not find a duplicate."""
    body = json.dumps(BODY).encode()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", f"Bearer {api.tokens['operator']}".encode()), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/api/v1/executions", "raw_path": b"/api/v1/executions", "root_path": "", "query_string": b"",
             "headers": headers, "server": ("test", 80), "client": ("127.0.0.1", 1)}  # fmt: skip
    await api.app(scope, receive, send)
    assert sent[0]["status"] == 499, sent
    assert await executions(api) == []
    # The same request from a client that stays: created.
    assert (await api.post("/api/v1/executions", json=BODY)).status_code == 201


async def test_no_connection_within_the_database_timeout_is_a_prompt_503(db_url: str) -> None:
    """Every connection of the pool is busy (as in an outage, when none can be made): the
    request gives up after api.database_timeout with a 503 and Retry-After."""
    settings = Settings(api={"database_timeout": 0.2, "retry_after": 3})
    pool = make_pool(db_url, "conveyor", "test-busy", 1)  # one connection, held below
    await pool.open(wait=True)
    try:
        async for api in make_api(settings, pool, db_url):
            assert (await api.get("/api/v1/executions", role="operator")).status_code == 200  # token cached
            async with pool.connection():
                began = time.monotonic()
                response = await api.post("/api/v1/executions", json=BODY, **keyed("busy"))
                took = time.monotonic() - began
            assert "database unavailable" in error_of(response, 503)
            assert response.headers["Retry-After"] == "3"
            assert took < PROMPT, took
            assert await executions(api) == []
    finally:
        await pool.close()
