"""The dashboard's plumbing: templates (autoescaped), the signed-in principal, sign-in and
sign-out, static files and the response headers every page gets."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from conveyor.api.auth import COOKIE, CSRF_HEADER, Principal, Role, authenticate

router = APIRouter()

COOKIE_SECONDS = 12 * 3600  # the browser forgets the token after this; sign in again
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": _CSP,  # no inline script or style: injected markup could not run anything
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_PACKAGE = "conveyor.api.dashboard"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
STATIC: dict[str, bytes] = {
    entry.name: entry.read_bytes()
    for entry in (resources.files(_PACKAGE) / "static").iterdir()
    if entry.name.endswith(tuple(_TYPES))
}
_VERSION = hashlib.sha256(b"".join(STATIC[name] for name in sorted(STATIC))).hexdigest()[:12]


# -- formatting --------------------------------------------------------------------------


def when(value: datetime | None) -> str:
    """A database timestamp, in UTC to the second."""
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 10:
        return f"{value:.3f} s"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def between(start: datetime | None, end: datetime | None) -> str:
    return "—" if start is None or end is None else seconds((end - start).total_seconds())


def pretty(value: Any) -> str:
    """JSON for a ``<pre>``: user data, escaped by the template like any other text."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


templates = Environment(
    loader=PackageLoader(_PACKAGE, "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),  # every template, whatever its name
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(when=when, seconds=seconds, pretty=pretty)
templates.globals.update(between=between, csrf_header=CSRF_HEADER, static=lambda n: f"/static/{n}?v={_VERSION}")


# -- who is signed in ----------------------------------------------------------------------


async def principal_of(request: Request) -> Principal | None:
    """The caller (cookie, or a bearer token), None if missing, invalid or revoked."""
    try:
        return await authenticate(request)
    except HTTPException:
        return None


def to_login(request: Request) -> RedirectResponse:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(here, safe='')}", status_code=303)


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path on this site only (no open redirect)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "/"
    return value


def render(
    request: Request, template: str, principal: Principal | None, status_code: int = 200, **context: Any
) -> HTMLResponse:
    role = principal.role if principal else None
    html = templates.get_template(template).render(
        request_path=request.url.path,
        principal=principal,
        can_operate=role is not None and role >= Role.operator,
        can_admin=role is not None and role >= Role.admin,
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers=HEADERS)


# -- routes ---------------------------------------------------------------------------------


@router.get("/static/{name}")
async def static(name: str) -> Response:
    body = STATIC.get(name)
    if body is None:
        return Response("not found", status_code=404, media_type="text/plain")
    suffix = name[name.rfind(".") :]
    headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}  # URLs carry ?v=
    return Response(body, media_type=_TYPES[suffix], headers=headers)


@router.get("/login")
async def login_form(request: Request) -> Response:
    principal = await principal_of(request)
    return render(request, "login.html", principal, next=safe_next(request.query_params.get("next")), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the token and keep it in the cookie: HttpOnly (no script reads it),
    SameSite=Strict (no other site's page sends it)."""
    try:
        fields = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
    except ValueError:  # more fields than the form has
        fields = {}
    token = (fields.get("token") or [""])[0].strip()
    target = safe_next((fields.get("next") or ["/"])[0])
    principal: Principal | None = await request.app.state.tokens.lookup(token) if token else None
    if principal is None:
        error = "invalid or revoked token" if token else "enter a token"
        return render(request, "login.html", None, status_code=401, next=target, error=error)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.api_route("/logout", methods=["GET", "POST"])
async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response
