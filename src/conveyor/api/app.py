"""The FastAPI application: ``/api/v1`` (bearer tokens), ``/health/*`` and ``/metrics``
(no auth), the dashboard at ``/``. OpenAPI at ``/api/v1/openapi.json``, docs at ``/docs``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from psycopg_pool import AsyncConnectionPool

import conveyor
from conveyor.api import dashboard, docs, errors
from conveyor.api.auth import TokenCache
from conveyor.api.context import ApiContext, ApiPool
from conveyor.api.limits import BodyLimit, JsonBodies
from conveyor.api.routes import (
    dead_letters,
    executions,
    health,
    inquiries,
    output,
    policies,
    resources,
    rules,
    webhooks,
    workflows,
)
from conveyor.api.routes import events as event_routes
from conveyor.api.routes import schedules as schedule_routes
from conveyor.api.routes import triggers as trigger_routes
from conveyor.config import Settings
from conveyor.transport.base import Transport

DESCRIPTION = """Conveyor's REST API. Every `/api/v1` endpoint needs `Authorization: Bearer <token>`
(create one with `conveyor tokens create --role viewer|operator|admin`). Errors are JSON
`{"error": "..."}`. Exception: `POST /api/v1/webhooks/{name}`, a webhook's door, is
authenticated by the webhook's own HMAC signature or token (docs/webhooks.md)."""


def create_app(settings: Settings, pool: AsyncConnectionPool[Any], transport: Transport) -> FastAPI:
    app = FastAPI(
        title="Conveyor",
        version=conveyor.__version__,
        description=DESCRIPTION,
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # docs.py serves /docs with Swagger UI's files from this server, not a CDN
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    api_pool = ApiPool(pool, settings.api.database_timeout)
    app.state.ctx = ApiContext(settings, api_pool, transport)
    app.state.tokens = TokenCache(api_pool)
    errors.install(app)
    v1 = APIRouter(prefix="/api/v1")
    v1.include_router(executions.router)
    v1.include_router(output.router)  # issue #15: live output
    v1.include_router(workflows.executions)
    v1.include_router(workflows.router)
    v1.include_router(resources.router)
    v1.include_router(dead_letters.router)
    v1.include_router(policies.router)
    v1.include_router(inquiries.router)
    # POST /api/v1/webhooks/{name} (the door) takes no API token: each webhook's own auth
    # decides (routes/webhooks.py). Its administration needs tokens, as every other route.
    v1.include_router(webhooks.router)
    v1.include_router(rules.router)
    v1.include_router(schedule_routes.router)
    v1.include_router(trigger_routes.router)  # issue #13: triggers, events, enforcements
    v1.include_router(event_routes.router)
    v1.include_router(event_routes.enforcements)
    app.include_router(v1)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.include_router(docs.router)
    app.add_middleware(JsonBodies, limits=settings.documents.limits())
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    return app
