"""What every route needs, kept on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.transport.base import Transport


@dataclass(frozen=True, slots=True)
class ApiContext:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    transport: Transport


def context(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx
