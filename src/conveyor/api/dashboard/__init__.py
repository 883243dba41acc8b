"""The dashboard: server-rendered pages (Jinja2, autoescaped) at ``/``, ``/executions``,
``/workers``, ``/dead-letters`` and ``/inquiries`` (with an answer form generated from
each inquiry's schema), automation's ``/events``, ``/enforcements``, ``/rules``,
``/triggers`` and ``/schedules`` (automation_pages.py), ``/charts`` (chart_pages.py) and,
for admins, ``/tokens`` (token_pages.py), kept live by a small script that polls HTML
fragments of the same templates (``/_live/...``) and patches the page in place. Sign-in
takes an API token and keeps it in an HttpOnly, SameSite=Strict cookie; state changes go
through ``/api/v1`` with ``fetch`` (the cookie authenticates; ``auth.py`` requires the
dashboard's custom header on them)."""

from __future__ import annotations

from fastapi import APIRouter

from conveyor.api.dashboard import automation_pages, chart_pages, pages, token_pages, web
from conveyor.api.dashboard.action_pages import router as actions_router  # issue #15
from conveyor.api.dashboard.policy_pages import router as policies_router  # issue #15

router = APIRouter(include_in_schema=False)
router.include_router(web.router)
router.include_router(pages.router)
router.include_router(automation_pages.router)
router.include_router(chart_pages.router)  # issue #15: /charts
router.include_router(token_pages.router)  # issue #15: /tokens, for admins
router.include_router(policies_router)  # issue #15: /policies
router.include_router(actions_router)  # issue #15: /actions

__all__ = ["router"]
