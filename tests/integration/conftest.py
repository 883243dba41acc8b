"""Fixtures for tests that drive executor and worker internals against the real database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.store.db import make_pool
from conveyor.transport.postgres import PostgresTransport


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
