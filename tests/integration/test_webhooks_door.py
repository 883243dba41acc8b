"""The webhook door, POST /api/v1/webhooks/{name}, against the real database: what it
accepts makes exactly one event; what it refuses stores nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import quote

from prometheus_client import REGISTRY

from integration.api_kit import LIMIT, Api, error_of
from integration.webhook_kit import SECRET, events, post, register, signed

PUSH = {"ref": "refs/heads/main", "repository": {"full_name": "octo/hello"}}


async def test_signed_right_makes_one_event_with_body_and_headers(api: Api) -> None:
    await register(api)
    response = await post(api, **signed(PUSH, **{"X-GitHub-Delivery": "d-1", "Authorization": "Bearer x"}))
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["repeated"] is False
    assert answer["trigger"] == "github"
    assert "Idempotent-Replayed" not in response.headers
    [event] = await events(api)
    assert event["id"] == answer["event_id"]
    assert event["source"] == "webhook"
    assert event["idempotency_key"] == "d-1"
    assert event["pending"]
    # The payload: the body, and only the kept headers (never Authorization or the signature).
    assert event["payload"] == {
        "body": PUSH,
        "headers": {"content-type": "application/json", "x-github-event": "push", "x-github-delivery": "d-1"},
    }


async def test_wrong_missing_or_tampered_signature_is_401_and_stores_nothing(api: Api) -> None:
    await register(api)
    wrong = await post(api, **signed(PUSH, secret="not it"))
    unsigned = await post(api, content=json.dumps(PUSH).encode(), headers={"Content-Type": "application/json"})
    tampered_kwargs = signed(PUSH)
    tampered_kwargs["content"] = tampered_kwargs["content"].replace(b"main", b"evil")
    tampered = await post(api, **tampered_kwargs)
    assert "wrong signature" in error_of(wrong, 401)
    assert "missing signature" in error_of(unsigned, 401)
    assert "wrong signature" in error_of(tampered, 401)
    assert await events(api) == []


async def test_configured_signature_header_and_prefix(api: Api) -> None:
    await register(api, "acme", signature_header="X-Acme-Signature", signature_prefix="")
    kwargs = signed(PUSH)
    sig = kwargs["headers"].pop("X-Hub-Signature-256")
    assert error_of(await post(api, "acme", **kwargs), 401)
    kwargs["headers"]["X-Acme-Signature"] = sig.removeprefix("sha256=").upper()  # hex in any case
    assert (await post(api, "acme", **kwargs)).status_code == 202


async def test_bearer_right_and_wrong(api: Api) -> None:
    saved = await register(api, "ci", auth="bearer", secret=None, token="s3cret-token")
    assert saved["token_set"]
    assert not saved["secret_set"]
    assert "token" not in saved
    body = {"content": b'{"build": 7}', "headers": {"Content-Type": "application/json"}}
    assert "bearer" in error_of(await post(api, "ci", **body), 401)
    wrong = {**body, "headers": {**body["headers"], "Authorization": "Bearer nope"}}
    assert error_of(await post(api, "ci", **wrong), 401)
    # The API's own admin token is no key to a webhook's door.
    admin = {**body, "headers": {**body["headers"], **api.auth("admin")}}
    assert error_of(await post(api, "ci", **admin), 401)
    assert await events(api, "ci") == []
    right = {**body, "headers": {**body["headers"], "Authorization": "Bearer s3cret-token"}}
    assert (await post(api, "ci", **right)).status_code == 202
    assert len(await events(api, "ci")) == 1
    stored = await api.one("SELECT token_hash, secret FROM webhook WHERE name = 'ci'")
    assert stored["secret"] is None
    assert len(stored["token_hash"]) == 64
    assert "s3cret" not in stored["token_hash"]


async def test_too_large_is_413_and_stores_nothing(api: Api) -> None:
    await register(api, max_body_bytes=100)
    big = {"pad": "x" * 200}
    assert "at most 100 bytes" in error_of(await post(api, **signed(big)), 413)
    # Over the API's own limit (smaller than a webhook's default 1 MiB) too.
    await register(api, "wide")
    huge = {"pad": "x" * LIMIT}
    assert error_of(await post(api, "wide", **signed(huge)), 413)
    assert await events(api) == []
    assert await events(api, "wide") == []


async def test_schema_violation_is_422_with_paths_and_stores_nothing(api: Api) -> None:
    schema = {"type": "object", "required": ["body"],
              "properties": {"body": {"type": "object", "required": ["ref"],
                                      "properties": {"ref": {"type": "string"}}}}}  # fmt: skip
    await register(api, payload_schema=schema)
    response = await post(api, **signed({"ref": 42}))
    error_of(response, 422)
    assert response.json()["problems"] == [{"path": "body.ref", "message": "42 is not of type 'string'"}]
    assert error_of(await post(api, **signed({"other": 1})), 422)
    assert await events(api) == []
    assert (await post(api, **signed(PUSH))).status_code == 202


async def test_same_delivery_twice_and_concurrently_is_one_event(api: Api) -> None:
    await register(api)
    kwargs = signed(PUSH, **{"X-GitHub-Delivery": "dup"})
    first = await post(api, **kwargs)
    again = await post(api, **kwargs)
    assert first.status_code == again.status_code == 202
    assert again.json() == {**first.json(), "repeated": True}
    assert again.headers["Idempotent-Replayed"] == "true"
    racing = await asyncio.gather(*(post(api, **signed(PUSH, **{"X-GitHub-Delivery": "race"})) for _ in range(8)))
    assert {r.status_code for r in racing} == {202}
    assert len({r.json()["event_id"] for r in racing}) == 1
    assert sum(not r.json()["repeated"] for r in racing) == 1
    assert [e["idempotency_key"] for e in await events(api)] == ["dup", "race"]


async def test_another_body_with_the_same_key_is_409(api: Api) -> None:
    await register(api)
    assert (await post(api, **signed(PUSH, **{"X-GitHub-Delivery": "k"}))).status_code == 202
    assert "already used" in error_of(await post(api, **signed({"other": 1}, **{"X-GitHub-Delivery": "k"})), 409)
    assert len(await events(api)) == 1


async def test_unknown_and_disabled_answer_the_same_404(api: Api) -> None:
    await register(api)
    disabled = await api.client.post("/api/v1/webhooks/github/disable", headers=api.auth("admin"))
    assert disabled.json() == {"name": "github", "enabled": False, "was": True}
    off = await post(api, **signed(PUSH))
    unknown = await post(api, "nothing", **signed(PUSH))
    assert off.status_code == unknown.status_code == 404
    assert off.json()["error"].replace("github", "X") == unknown.json()["error"].replace("nothing", "X")
    assert error_of(await post(api, quote("../x y", safe=""), **signed(PUSH)), 404)
    assert await events(api) == []
    await api.client.post("/api/v1/webhooks/github/enable", headers=api.auth("admin"))
    assert (await post(api, **signed(PUSH))).status_code == 202


async def test_bodies_that_are_not_json(api: Api) -> None:
    await register(api)
    assert "malformed JSON" in error_of(await post(api, **signed(b"{nope")), 400)
    assert "empty body" in error_of(await post(api, **signed(b"")), 400)
    assert "Unicode" in error_of(await post(api, **signed(b'{"a": "\\u0000"}')), 400)
    assert "surrogate" in error_of(await post(api, **signed(b'{"a": "\\ud800"}')), 400)
    assert error_of(await post(api, **signed(b"NaN")), 400)
    xml = signed(b"<push/>", **{"Content-Type": "application/xml"})
    assert "unsupported content type" in error_of(await post(api, **xml), 415)
    assert await events(api) == []


async def test_github_form_encoding_and_curl_d(api: Api) -> None:
    await register(api)
    form = b"payload=" + quote(json.dumps(PUSH)).encode()
    response = await post(api, **signed(form, **{"Content-Type": "application/x-www-form-urlencoded"}))
    assert response.status_code == 202, response.text
    # curl -d '{...}' without -H sends its JSON as a form: read as JSON.
    curl = signed(b'{"n": 1}', **{"Content-Type": "application/x-www-form-urlencoded"})
    assert (await post(api, **curl)).status_code == 202
    assert [e["payload"]["body"] for e in await events(api)] == [PUSH, {"n": 1}]
    extra = signed(form + b"&x=1", **{"Content-Type": "application/x-www-form-urlencoded"})
    assert error_of(await post(api, **extra), 400)


async def test_no_auth_and_metrics(api: Api) -> None:
    await register(api, "open", auth="none", secret=None)
    before = REGISTRY.get_sample_value("conveyor_webhook_requests_total", {"webhook": "open", "code": "202"}) or 0
    unknown = REGISTRY.get_sample_value("conveyor_webhook_requests_total", {"webhook": "unknown", "code": "404"}) or 0
    assert (await post(api, "open", content=b"[1, 2]")).status_code == 202
    assert (await post(api, "no-such-hook-" + SECRET[:3], content=b"[]")).status_code == 404
    after = REGISTRY.get_sample_value("conveyor_webhook_requests_total", {"webhook": "open", "code": "202"})
    assert after == before + 1
    assert (
        REGISTRY.get_sample_value("conveyor_webhook_requests_total", {"webhook": "unknown", "code": "404"})
        == unknown + 1
    )


async def test_a_streamed_body_without_length_is_cut_at_the_limit(api: Api) -> None:
    await register(api, max_body_bytes=100)
    await register(api, "wide")

    async def chunks(total: int) -> AsyncIterator[bytes]:
        yield b'{"pad": "'
        for _ in range(total // 50):
            yield b"x" * 50
        yield b'"}'

    for name, size in (("github", 200), ("wide", LIMIT * 2)):
        response = await post(api, name, content=chunks(size), headers={"X-Hub-Signature-256": "sha256=00"})
        assert "content-length" not in response.request.headers
        assert "too large" in error_of(response, 413)
    assert await events(api) == []
    assert await events(api, "wide") == []


async def test_a_trigger_schema_stored_unchecked_refuses_every_payload(api: Api) -> None:
    await register(api, "open", auth="none", secret=None)
    await api.sql("""SELECT register_trigger('open', 'webhook', '{"type": "no-such-type"}')""")
    assert "not valid JSON Schema" in error_of(await post(api, "open", content=b"{}"), 422)
    assert await events(api, "open") == []
