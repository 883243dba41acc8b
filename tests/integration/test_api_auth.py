"""Integration: the REST API's authentication and roles, tokens, and the endpoints that
need no token (health, metrics), in-process against the per-test database.

State the API does not create itself (a running execution, a worker, a dead letter) is set
up with SQL, as the executor and worker would leave it (api_kit.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.api import auth
from conveyor.api.app import create_app
from conveyor.config import Settings
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import (
    SEEDS_BODY,
    TIMEOUT,
    Api,
    error_of,
)
from support.polling import until

# -- authentication and roles ------------------------------------------------------------------


async def test_missing_invalid_and_malformed_tokens_are_401(api: Api) -> None:
    paths = ["/api/v1/executions", "/api/v1/actions", "/api/v1/workers", "/api/v1/dead-letters", "/api/v1/tokens"]
    for path in paths:
        response = await api.client.get(path)
        assert "missing token" in error_of(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
    for header in ("Bearer cvy_nope", "Bearer " + "x" * 4000, "bearer cvy_nope"):
        response = await api.client.get("/api/v1/executions", headers={"Authorization": header})
        assert error_of(response, 401) == "invalid or revoked token"
    for header in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer    ", api.tokens["admin"]):
        response = await api.client.get("/api/v1/executions", headers={"Authorization": header})
        assert "missing token" in error_of(response, 401)
    error_of(await api.client.post("/api/v1/executions", content=SEEDS_BODY), 401)
    assert await api.sql("SELECT id FROM execution") == []


async def test_a_revoked_token_is_refused(
    api: Api, settings: Settings, pool: AsyncConnectionPool[Any], transport: PostgresTransport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(auth, "_CACHE_SECONDS", 0.5)  # 5 s in production
    created = (await api.post("/api/v1/tokens", role="admin", json={"name": "short-lived", "role": "viewer"})).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert (await api.client.get("/api/v1/executions", headers=headers)).status_code == 200  # now cached
    assert (await api.delete(f"/api/v1/tokens/{created['id']}")).status_code == 204

    # A fresh process refuses it at once...
    fresh = create_app(settings, pool, transport)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fresh), base_url="http://test") as client:
        assert error_of(await client.get("/api/v1/executions", headers=headers), 401) == "invalid or revoked token"

    # ... and one that had it cached, once its cache time is over.
    async def refused() -> httpx.Response | None:
        response = await api.client.get("/api/v1/executions", headers=headers)
        return None if response.status_code == 200 else response

    response = await until(refused, timeout=TIMEOUT, what="a revoked token refused", interval=0.05)
    assert error_of(response, 401) == "invalid or revoked token"


# (method, path, JSON body, the least role allowed, the status that role gets)
MUTATIONS: list[tuple[str, str, Any, str, int]] = [
    ("POST", "/api/v1/executions", {"action_ref": "core.noop"}, "operator", 201),
    ("POST", "/api/v1/executions/999999/cancel", None, "operator", 404),
    ("POST", "/api/v1/executions/999999/rerun", None, "operator", 404),
    ("POST", "/api/v1/dead-letters/999999/replay", None, "operator", 404),
    ("DELETE", "/api/v1/dead-letters?execution=999999", None, "operator", 200),
    ("POST", "/api/v1/workers/nobody/cordon", None, "admin", 404),
    ("POST", "/api/v1/workers/nobody/uncordon", None, "admin", 404),
    ("POST", "/api/v1/workers/nobody/drain", None, "admin", 404),
    ("GET", "/api/v1/tokens", None, "admin", 200),
    ("POST", "/api/v1/tokens", {"name": "n", "role": "viewer"}, "admin", 201),
    ("DELETE", "/api/v1/tokens/999999", None, "admin", 404),
    ("PUT", "/api/v1/policies/core.noop", {"concurrency": 1}, "admin", 200),
    ("DELETE", "/api/v1/policies/nothing.here", None, "admin", 404),
]


async def test_every_mutating_endpoint_checks_the_role(api: Api) -> None:
    order = ["viewer", "operator", "admin"]
    for method, path, body, least, allowed in MUTATIONS:
        for role in order:
            response = await api.client.request(method, path, json=body, headers=api.auth(role))
            if order.index(role) < order.index(least):
                message = error_of(response, 403)
                assert f"needs the {least} role" in message, message
                assert f"is {role}" in message, message
            else:
                assert response.status_code == allowed, (method, path, role, response.text)


async def test_viewers_read_everything_but_tokens(api: Api) -> None:
    for path in ("/api/v1/executions", "/api/v1/actions", "/api/v1/workers", "/api/v1/dead-letters"):
        assert (await api.get(path, role="viewer")).status_code == 200, path
    error_of(await api.get("/api/v1/tokens", role="viewer"), 403)
    error_of(await api.get("/api/v1/tokens", role="operator"), 403)


async def test_unknown_routes_and_methods_answer_json(api: Api) -> None:
    error_of(await api.get("/api/v1/nothing-here"), 404)
    error_of(await api.client.put("/api/v1/executions", headers=api.auth("admin"), json={}), 405)


# -- health, metrics, settings ----------------------------------------------------------------


async def test_health_and_metrics_need_no_token(api: Api) -> None:
    live = await api.client.get("/health/live")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    ready = await api.client.get("/health/ready")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready", "checks": {"database": True}})
    metrics = await api.client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "# HELP" in metrics.text
    assert "# TYPE" in metrics.text


def test_api_settings_defaults() -> None:
    cfg = Settings().api
    assert (cfg.host, cfg.port, cfg.max_body_bytes, cfg.stream_interval) == ("0.0.0.0", 8080, 10 * 1024 * 1024, 1.0)


# -- tokens ---------------------------------------------------------------------------------------


async def test_tokens_create_list_revoke(api: Api) -> None:
    response = await api.post("/api/v1/tokens", role="admin", json={"name": "ci", "role": "operator"})
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["token"].startswith("cvy_")
    assert created["token"].startswith(created["prefix"])
    assert (created["name"], created["role"]) == ("ci", "operator")
    headers = {"Authorization": f"Bearer {created['token']}"}
    response = await api.client.post("/api/v1/executions", headers=headers, json={"action_ref": "core.noop"})
    assert response.status_code == 201
    error_of(await api.client.get("/api/v1/tokens", headers=headers), 403)

    listed = (await api.get("/api/v1/tokens", role="admin")).json()
    [mine] = [t for t in listed if t["id"] == created["id"]]
    assert "token" not in mine
    assert mine["revoked"] is None
    assert mine["last_used"] is not None
    assert all(set(t) == {"id", "name", "role", "prefix", "created", "last_used", "revoked"} for t in listed)
    stored = await api.one("SELECT token_hash FROM api_token WHERE id = %s", (created["id"],))
    assert created["token"].encode() not in bytes(stored["token_hash"])

    assert (await api.delete(f"/api/v1/tokens/{created['id']}")).status_code == 204
    assert "no live token" in error_of(await api.delete(f"/api/v1/tokens/{created['id']}"), 404)
    [mine] = [t for t in (await api.get("/api/v1/tokens", role="admin")).json() if t["id"] == created["id"]]
    assert mine["revoked"] is not None

    for bad in ({"name": "x", "role": "root"}, {"name": "", "role": "viewer"}, {"role": "viewer"},
                {"name": "x", "role": "viewer", "extra": 1}):  # fmt: skip
        error_of(await api.post("/api/v1/tokens", role="admin", json=bad), 422)
