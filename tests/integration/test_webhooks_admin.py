"""Administering webhooks: /api/v1/webhooks (viewers read, admins change) and the SQL
verbs under it (register_webhook, delete_webhook, set_webhook_enabled of migration 0017)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from integration.api_kit import Api, error_of
from integration.webhook_kit import DOOR, SECRET, events, post, register, signed


async def test_put_creates_then_updates_with_its_trigger_and_never_answers_a_secret(api: Api) -> None:
    saved = await register(api, description="pushes")
    assert saved["created_now"] is True
    assert saved["secret_set"] is True
    assert saved["secret"] is None
    assert SECRET not in str(saved)
    assert saved["url"] == "/api/v1/webhooks/github"
    trigger = await api.one("SELECT type, description FROM trigger WHERE name = 'github'")
    assert trigger == {"type": "webhook", "description": "pushes"}
    # Update without the secret: the stored one is kept (the door still verifies with it).
    again = await api.client.put(f"{DOOR}github", json={"auth": "hmac", "max_body_bytes": 5000},
                                 headers=api.auth("admin"))  # fmt: skip
    assert again.status_code == 200, again.text
    assert again.json()["created_now"] is False
    assert again.json()["max_body_bytes"] == 5000
    assert again.json()["idempotency_header"] == "Idempotency-Key"  # omitted: the default again
    assert (await post(api, **signed({"a": 1}))).status_code == 202
    for path in ("", "/github"):
        shown = await api.get(f"/api/v1/webhooks{path}")
        assert shown.status_code == 200
        assert SECRET not in shown.text
    listed = (await api.get("/api/v1/webhooks")).json()
    assert [(w["name"], w["events"]) for w in listed] == [("github", 1)]


async def test_generated_secret_is_answered_once(api: Api) -> None:
    response = await api.client.put(f"{DOOR}gen", json={"auth": "hmac", "generate_secret": True},
                                    headers=api.auth("admin"))  # fmt: skip
    secret = response.json()["secret"]
    assert len(secret) >= 40
    assert secret not in (await api.get(f"{DOOR}gen")).text
    assert (await post(api, "gen", **signed({"x": 1}, secret=secret))).status_code == 202


async def test_roles(api: Api) -> None:
    await register(api)
    body = {"auth": "none"}
    for role in ("viewer", "operator"):
        assert error_of(await api.client.put(f"{DOOR}x", json=body, headers=api.auth(role)), 403)
        assert error_of(await api.client.delete(f"{DOOR}github", headers=api.auth(role)), 403)
        assert error_of(await api.client.post(f"{DOOR}github/disable", headers=api.auth(role)), 403)
    assert error_of(await api.client.get(DOOR.rstrip("/")), 401)
    assert (await api.get(DOOR.rstrip("/"), role="viewer")).status_code == 200


async def test_invalid_definitions_are_422(api: Api) -> None:
    cases = [
        ("bad name!", {"auth": "none"}),
        ("h", {"auth": "hmac"}),  # no secret
        ("h", {"auth": "bearer"}),  # no token
        ("h", {"auth": "none", "secret": "s"}),
        ("h", {"auth": "none", "signature_header": "Bad Header"}),
        ("h", {"auth": "none", "payload_schema": {"type": "nonsense"}}),
        ("h", {"auth": "hmac", "generate_secret": True, "secret": "s"}),
    ]
    for name, body in cases:
        response = await api.client.put(f"{DOOR}{name}", json=body, headers=api.auth("admin"))
        assert response.status_code in (404, 405, 422), (name, body, response.text)
        if name == "h":
            error_of(response, 422)
    assert await api.sql("SELECT name FROM webhook") == []
    assert await api.sql("SELECT name FROM trigger") == []


async def test_a_trigger_of_another_type_is_409(api: Api) -> None:
    await api.sql("SELECT register_trigger('nightly', 'cron')")
    response = await api.client.put(f"{DOOR}nightly", json={"auth": "none"}, headers=api.auth("admin"))
    assert "cron trigger" in error_of(response, 409)
    assert await api.sql("SELECT name FROM webhook") == []


async def test_delete_keeps_events_and_removes_an_unused_trigger(api: Api) -> None:
    await register(api, "used")
    await register(api, "unused")
    assert (await post(api, "used", **signed({"a": 1}))).status_code == 202
    for name in ("used", "unused"):
        deleted = await api.delete(f"{DOOR}{name}")
        assert deleted.json() == {"name": name, "deleted": True}
    assert error_of(await api.delete(f"{DOOR}used"), 404)
    assert error_of(await post(api, "used", **signed({"a": 1})), 404)
    assert [t["name"] for t in await api.sql("SELECT name FROM trigger ORDER BY name")] == ["used"]
    assert len(await events(api, "used")) == 1
    # Registered again: the kept trigger (and its events) are its own again.
    await register(api, "used")
    assert (await api.get(f"{DOOR}used")).json()["events"] == 1


async def test_sql_verbs(api: Api) -> None:
    row = await api.one("SELECT * FROM register_webhook('s', auth => 'none', trigger => 'custom-name')")
    assert row == {"created": True}
    assert (await api.one("SELECT trigger FROM webhook WHERE name = 's'"))["trigger"] == "custom-name"
    assert await api.sql("SELECT * FROM set_webhook_enabled('s', false)") == [{"was": True}]
    assert await api.sql("SELECT * FROM set_webhook_enabled('nope', false)") == []
    # Switching to hmac needs a secret; switching away from it drops the secret.
    with pytest.raises(psycopg.Error) as refused:
        await api.sql("SELECT * FROM register_webhook('s', auth => 'hmac')")
    assert refused.value.sqlstate == "CVW01"
    await api.sql("SELECT * FROM register_webhook('s', auth => 'hmac', secret => 'k')")
    await api.sql("SELECT * FROM register_webhook('s', auth => 'none')")
    assert (await api.one("SELECT secret, enabled FROM webhook WHERE name = 's'")) == {
        "secret": None,
        "enabled": False,
    }
    with pytest.raises(psycopg.Error) as refused:
        await api.sql("SELECT * FROM register_webhook('t', auth => 'bearer', token_hash => 'plain-token')")
    assert refused.value.sqlstate == "CVW01"
    with pytest.raises(psycopg.Error) as refused:
        await api.sql("SELECT * FROM register_webhook('t', auth => 'none', trigger => 'custom-name')")
    assert refused.value.sqlstate == "CVW01"  # each webhook its own trigger
    assert (await api.one("SELECT delete_webhook('s') AS d"))["d"] is True
    assert (await api.one("SELECT delete_webhook('s') AS d"))["d"] is False


async def test_concurrent_registrations_of_one_name(api: Api) -> None:
    puts = [api.client.put(f"{DOOR}same", json={"auth": "hmac", "secret": f"s{i}"}, headers=api.auth("admin"))
            for i in range(6)]  # fmt: skip
    answers = await asyncio.gather(*puts)
    assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
    assert sum(r.json()["created_now"] for r in answers) == 1
    assert len(await api.sql("SELECT name FROM webhook")) == 1
