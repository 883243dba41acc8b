"""What every route needs, kept on ``app.state``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.transport.base import Transport


class ApiPool:
    """The process's pool as requests use it: a connection within ``timeout`` seconds
    (api.database_timeout), else PoolTimeout, answered 503. With the pool's own default
    (30 s) a request waited that long in a database outage, and a POST whose client had
    given up meanwhile still committed when the database came back. The executor and
    worker sharing the pool (``conveyor up``) keep its default."""

    def __init__(self, pool: AsyncConnectionPool[Any], timeout: float) -> None:
        self._pool = pool
        self.timeout = timeout

    def connection(self) -> AbstractAsyncContextManager[Any]:
        return self._pool.connection(timeout=self.timeout)


@dataclass(frozen=True, slots=True)
class ApiContext:
    settings: Settings
    pool: ApiPool
    transport: Transport


def context(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx
