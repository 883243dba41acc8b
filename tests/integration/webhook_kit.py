"""Webhook tests' helpers: registering one through the API, signing and posting to its
door (without the API's token: the door takes none), counting what was stored."""

from __future__ import annotations

import json
from typing import Any

import httpx

from conveyor.domain.webhooks import signature
from integration.api_kit import Api

SECRET = "It's a Secret to Everybody"
DOOR = "/api/v1/webhooks/"


async def register(api: Api, name: str = "github", **body: Any) -> dict[str, Any]:
    body = {"auth": "hmac", "secret": SECRET, "idempotency_header": "X-GitHub-Delivery", **body}
    response = await api.client.put(f"{DOOR}{name}", json=body, headers=api.auth("admin"))
    assert response.status_code == 200, response.text
    saved: dict[str, Any] = response.json()
    return saved


def signed(body: bytes | dict[str, Any], secret: str = SECRET, **headers: str) -> dict[str, Any]:
    """The keyword arguments of a signed, GitHub-like POST of ``body``."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", "X-GitHub-Event": "push",
            "X-Hub-Signature-256": signature(secret, raw), **headers}  # fmt: skip
    return {"content": raw, "headers": sent}


async def post(api: Api, name: str = "github", **kwargs: Any) -> httpx.Response:
    return await api.client.post(f"{DOOR}{name}", **kwargs)


async def events(api: Api, trigger: str = "github") -> list[dict[str, Any]]:
    return await api.sql(
        "SELECT e.id, e.payload, e.source, e.idempotency_key, p.event IS NOT NULL AS pending"
        " FROM event e LEFT JOIN event_pending p ON p.event = e.id WHERE e.trigger = %s ORDER BY e.id",
        (trigger,),
    )
