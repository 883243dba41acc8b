"""``/health/live``, ``/health/ready`` (no auth: for probes) and ``/metrics``."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import prometheus_client
import psycopg
from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse

from conveyor.api.context import ApiContext, context

router = APIRouter(tags=["health"])
Ctx = Annotated[ApiContext, Depends(context)]


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/health/ready", responses={503: {"description": "not ready"}})
async def ready(ctx: Ctx) -> Any:
    database = True
    try:
        async with asyncio.timeout(1.0), ctx.pool.connection() as conn:
            await conn.execute("SELECT 1")
    except (psycopg.Error, TimeoutError):
        database = False
    body = {"status": "ready" if database else "not ready", "checks": {"database": database}}
    return JSONResponse(body, status_code=200 if database else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics() -> Response:
    return Response(prometheus_client.generate_latest(), media_type=prometheus_client.CONTENT_TYPE_LATEST)
