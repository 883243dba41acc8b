"""The dashboard's automation pages (issue #13): events, enforcements, rules, triggers and
webhooks, schedules. Rendered and kept live as the other pages are (``pages._view``:
the same sign-in, 404 and 503 handling; ``/_live/...`` parts polled by the page's
script)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from conveyor.api.dashboard import automation
from conveyor.api.dashboard.automation import EnforcementFilters, EventFilters
from conveyor.api.dashboard.pages import Loader, _view
from conveyor.store.db import AsyncConn

router = APIRouter()


# -- events -----------------------------------------------------------------------------


def _events_loader(request: Request, page: bool = True) -> Loader:
    filters = EventFilters.parse(request.query_params)

    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await automation.events(conn, filters, page)

    return load


@router.get("/events")
async def events(request: Request) -> Response:
    return await _view(request, "events.html", _events_loader(request))


@router.get("/_live/events")
async def events_live(request: Request) -> Response:
    return await _view(request, "events.html", _events_loader(request, page=False), live=True)


def _event_loader(event_id: str) -> Loader:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await automation.event(conn, automation.positive_id(event_id, "event"))

    return load


@router.get("/events/{event_id}")
async def event(request: Request, event_id: str) -> Response:
    return await _view(request, "event.html", _event_loader(event_id))


@router.get("/_live/events/{event_id}")
async def event_live(request: Request, event_id: str) -> Response:
    return await _view(request, "event.html", _event_loader(event_id), live=True)


# -- enforcements -----------------------------------------------------------------------


def _enforcements_loader(request: Request, page: bool = True) -> Loader:
    filters = EnforcementFilters.parse(request.query_params)

    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await automation.enforcements(conn, filters, page)

    return load


@router.get("/enforcements")
async def enforcements(request: Request) -> Response:
    return await _view(request, "enforcements.html", _enforcements_loader(request))


@router.get("/_live/enforcements")
async def enforcements_live(request: Request) -> Response:
    return await _view(request, "enforcements.html", _enforcements_loader(request, page=False), live=True)


# -- rules, triggers and webhooks -------------------------------------------------------


@router.get("/rules")
async def rules(request: Request) -> Response:
    return await _view(request, "rules.html", automation.rules)


@router.get("/rules/{ref}")
async def rule(request: Request, ref: str) -> Response:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await automation.rule(conn, ref)

    return await _view(request, "rule.html", load)


@router.get("/triggers")
async def triggers(request: Request) -> Response:
    return await _view(request, "triggers.html", automation.triggers)


# -- schedules --------------------------------------------------------------------------


@router.get("/schedules")
async def schedules(request: Request) -> Response:
    return await _view(request, "schedules.html", automation.schedules)


@router.get("/_live/schedules")
async def schedules_live(request: Request) -> Response:
    return await _view(request, "schedules.html", automation.schedules, live=True)


def _schedule_loader(name: str) -> Loader:
    async def load(conn: AsyncConn) -> dict[str, Any]:
        return await automation.schedule(conn, name)

    return load


@router.get("/schedules/{name}")
async def schedule(request: Request, name: str) -> Response:
    return await _view(request, "schedule.html", _schedule_loader(name))


@router.get("/_live/schedules/{name}")
async def schedule_live(request: Request, name: str) -> Response:
    return await _view(request, "schedule.html", _schedule_loader(name), live=True)
