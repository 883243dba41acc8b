"""The dashboard's pages (overview, executions, workers, dead letters, inquiries), and
their live parts: ``/_live/<page>`` renders the same partial template the page includes,
for the page's script to patch in place (every 1.5 s)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import psycopg
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import Response

from conveyor.api.context import context
from conveyor.api.dashboard import data, listing, worker_views, workflow_views
from conveyor.api.dashboard.data import DeadLetterFilters, ExecutionFilters, NotFound
from conveyor.api.dashboard.web import HEADERS, principal_of, render, to_login
from conveyor.domain.dead_letters import REASONS, RESOLUTIONS
from conveyor.domain.ids import parse_id
from conveyor.store.db import AsyncConn, log_operational

router = APIRouter()
log = structlog.get_logger(__name__)
Loader = Callable[[Any], Awaitable[dict[str, Any]]]


async def _view(request: Request, template: str, load: Loader, live: bool = False) -> Response:
    """Render ``template`` (``_template`` for a live part) with what ``load`` reads. Pages
    send a visitor without a valid token to the sign-in form; live parts answer 401, and
    the script says so."""
    principal = await principal_of(request)
    if principal is None:
        return Response("sign in again", status_code=401, headers=HEADERS) if live else to_login(request)
    try:
        async with context(request).pool.connection() as conn:
            values = await load(conn)
    except NotFound as exc:
        if live:
            return Response(str(exc), status_code=404, headers=HEADERS)
        return render(request, "error.html", principal, status_code=404, message=str(exc))
    except psycopg.OperationalError as exc:
        log_operational(log, "dashboard page", exc, path=request.url.path)
        if live:
            return Response("database unavailable", status_code=503, headers={**HEADERS, "Retry-After": "1"})
        return render(request, "error.html", principal, status_code=503, message="database unavailable; retry later")
    return render(request, f"_{template}" if live else template, principal, **values)


# -- overview -------------------------------------------------------------------------------

_OVERVIEW_TTL = 1.0


def cached(request: Request, key: str, ttl: float, read: Loader) -> Loader:
    """``read`` at most once every ``ttl`` seconds per API process, however many browsers
    poll the page: its values are kept on the app's state under ``key``."""
    state = request.app.state

    async def load(conn: AsyncConn) -> dict[str, Any]:
        read_at, values = getattr(state, key, (0.0, {}))
        if time.monotonic() - read_at >= ttl:
            values = await read(conn)
            setattr(state, key, (time.monotonic(), values))
        return dict(values)

    return load


def _overview_loader(request: Request) -> Loader:
    """The overview counts whole tables: read at most once a second."""
    return cached(request, "dashboard_overview", _OVERVIEW_TTL, data.overview)


@router.get("/")
async def overview(request: Request) -> Response:
    return await _view(request, "overview.html", _overview_loader(request))


@router.get("/_live/overview")
async def overview_live(request: Request) -> Response:
    return await _view(request, "overview.html", _overview_loader(request), live=True)


# -- executions -----------------------------------------------------------------------------


def _executions_loader(request: Request, page: bool) -> Loader:
    filters = ExecutionFilters.parse(request.query_params)

    async def load(conn: AsyncConn) -> dict[str, Any]:
        values = {**await data.executions(conn, filters), "filters": filters}
        if page:
            actions = await data.actions(conn)
            schemas = {a["ref"]: {"schema": a["parameters_schema"], "description": a["description"]} for a in actions}
            values.update(
                actions=actions,
                schemas=schemas,
                statuses=data.STATUSES,
                worker_names=[w["name"] for w in await data.workers(conn)],
            )
            values.update(
                retry_query=urlencode(listing.api_query(filters)),
                retry_limit=listing.RETRY_LIMIT,
                search_scan=listing.SCAN,
            )
            values.update(request_ref=request.query_params.get("request"))  # /actions' "Request…" link
        return values

    return load


@router.get("/executions")
async def executions(request: Request) -> Response:
    return await _view(request, "executions.html", _executions_loader(request, page=True))


@router.get("/_live/executions")
async def executions_live(request: Request) -> Response:
    return await _view(request, "executions.html", _executions_loader(request, page=False), live=True)


def _execution_loader(execution_id: str) -> Loader:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        eid = parse_id(execution_id)
        if eid is None:
            raise NotFound(f"no execution {execution_id}")
        return await data.execution(conn, eid)

    return load


@router.get("/executions/{execution_id}")
async def execution(request: Request, execution_id: str) -> Response:
    return await _view(request, "execution.html", _execution_loader(execution_id))


@router.get("/_live/executions/{execution_id}")
async def execution_live(request: Request, execution_id: str) -> Response:
    return await _view(request, "execution.html", _execution_loader(execution_id), live=True)


# -- workers --------------------------------------------------------------------------------


async def _workers(conn: AsyncConn) -> dict[str, Any]:
    return await worker_views.workers(conn)  # issue #15: runs, offers, why inactive


@router.get("/workers")
async def workers(request: Request) -> Response:
    return await _view(request, "workers.html", _workers)


@router.get("/_live/workers")
async def workers_live(request: Request) -> Response:
    return await _view(request, "workers.html", _workers, live=True)


# -- dead letters ---------------------------------------------------------------------------


def _dead_letters_loader(request: Request) -> Loader:
    filters = DeadLetterFilters.parse(request.query_params)

    async def load(conn: AsyncConn) -> dict[str, Any]:
        return {
            **await data.dead_letters(conn, filters),
            "filters": filters,
            "reasons": REASONS,
            "resolutions": RESOLUTIONS,
        }

    return load


@router.get("/dead-letters")
async def dead_letters(request: Request) -> Response:
    return await _view(request, "dead_letters.html", _dead_letters_loader(request))


@router.get("/_live/dead-letters")
async def dead_letters_live(request: Request) -> Response:
    return await _view(request, "dead_letters.html", _dead_letters_loader(request), live=True)


# -- workflows ------------------------------------------------------------------------------


@router.get("/workflows")
async def workflows(request: Request) -> Response:
    return await _view(request, "workflows.html", workflow_views.workflows)


@router.get("/workflows/{ref}")
async def workflow(request: Request, ref: str) -> Response:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        values = await workflow_views.workflow(conn, ref)
        if values is None:
            raise NotFound(f"no workflow {ref}")
        return values

    return await _view(request, "workflow.html", load)


# -- inquiries ------------------------------------------------------------------------------


def _inquiries_loader(request: Request) -> Loader:
    raw = request.query_params.get("status", "pending")
    status = raw if raw in data.INQUIRY_STATUSES else None  # "any" (or anything else): every status

    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await data.inquiries(conn, status)

    return load


@router.get("/inquiries")
async def inquiries(request: Request) -> Response:
    return await _view(request, "inquiries.html", _inquiries_loader(request))


@router.get("/_live/inquiries")
async def inquiries_live(request: Request) -> Response:
    return await _view(request, "inquiries.html", _inquiries_loader(request), live=True)


def _inquiry_loader(inquiry_id: str) -> Loader:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        iid = parse_id(inquiry_id)
        if iid is None:
            raise NotFound(f"no inquiry {inquiry_id}")
        return await data.inquiry(conn, iid)

    return load


@router.get("/inquiries/{inquiry_id}")
async def inquiry(request: Request, inquiry_id: str) -> Response:
    return await _view(request, "inquiry.html", _inquiry_loader(inquiry_id))


@router.get("/_live/inquiries/{inquiry_id}")
async def inquiry_live(request: Request, inquiry_id: str) -> Response:
    return await _view(request, "inquiry.html", _inquiry_loader(inquiry_id), live=True)
