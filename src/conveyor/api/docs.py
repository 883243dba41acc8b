"""``/docs``: Swagger UI for the API, every file of it served by Conveyor.

FastAPI's own docs page loads Swagger UI from a CDN, so it is blank on a machine without
internet access (issue #15). The page here is FastAPI's (``get_swagger_ui_html``), pointed
at ``/docs/assets/...``: the files of the ``fastapi-swagger`` package, which ships Swagger
UI's dist bundle (only read as package data; its FastAPI patch is not used)."""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import metadata, resources

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

_PACKAGE = "fastapi_swagger"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


@cache
def asset(name: str) -> bytes:
    """A file of Swagger UI's dist, read once (the bundle is about 1.7 MB)."""
    return (resources.files(_PACKAGE) / "resources" / name).read_bytes()


@cache
def _version() -> str:
    # In the assets' URLs: a new Swagger UI is a new URL, so they can be cached for a day.
    return metadata.version("fastapi-swagger")


def _csp(html: str) -> str:
    """The dashboard's policy, but for the page's one inline script (Swagger UI's set-up,
    allowed by its hash: nothing else inline runs) and inline styles, which Swagger UI's
    React components use. Every file still comes from this server."""
    digests = (base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() for body in _SCRIPT.findall(html))
    hashes = " ".join(f"'sha256-{digest}'" for digest in digests)
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "font-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


@router.get("/docs")
async def docs() -> Response:
    page = get_swagger_ui_html(
        openapi_url="/api/v1/openapi.json",
        title="Conveyor API",
        swagger_js_url=f"/docs/assets/swagger-ui-bundle.js?v={_version()}",
        swagger_css_url=f"/docs/assets/swagger-ui.css?v={_version()}",
        swagger_favicon_url=f"/docs/assets/favicon-32x32.png?v={_version()}",
        # No validator badge: it would ask validator.swagger.io about the document.
        swagger_ui_parameters={"validatorUrl": None},
    )
    html = bytes(page.body).decode()
    headers = {
        "Content-Security-Policy": _csp(html),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }
    return Response(html, media_type="text/html; charset=utf-8", headers=headers)


@router.get("/docs/assets/{name}")
async def docs_asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        return Response("not found", status_code=404, media_type="text/plain")
    headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}  # URLs carry ?v=
    return Response(asset(name), media_type=media_type, headers=headers)
