"""Fixtures for tests that drive executor and worker internals against the real database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.api.app import create_app
from conveyor.api.auth import Role, create_token
from conveyor.config import Settings
from conveyor.store.db import connect_sync, make_pool
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import LIMIT, Api


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    p = make_pool(db_url, "conveyor", "test", 6)
    await p.open()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def transport(db_url: str) -> PostgresTransport:
    return PostgresTransport(db_url, "conveyor")


@pytest.fixture
def lock_holder(db_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A separate session standing in for a live worker's liveness connection."""
    with connect_sync(db_url, "conveyor", autocommit=True) as c:
        yield c


# The API tests' application (their modules import ``Api`` from api_kit.py); a module may
# override ``settings`` (the transport tests do).
@pytest.fixture
def settings() -> Settings:
    # database_timeout: a connection of the test pool (6, opened on demand) can take over the
    # default second to open while four test processes set up their databases (CI: two of
    # five racing inquiry answers got 503 instead of 409). The prompt 503 has its own test,
    # with its own settings (test_api_idempotency.py).
    return Settings(api={"max_body_bytes": LIMIT, "stream_interval": 0.05, "database_timeout": 10})


@pytest.fixture
async def api(settings: Settings, pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> AsyncIterator[Api]:
    app = create_app(settings, pool, transport)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        api = Api(app, client, pool)
        async with pool.connection() as conn:
            for role in Role:
                api.tokens[role.name], _ = await create_token(conn, f"test {role.name}", role)
        yield api
