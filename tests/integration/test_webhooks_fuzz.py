"""Hypothesis fuzzes the webhook door with any name, headers and body: never a 5xx, every
status one the door documents, and an event stored only for a request that was
authenticated (right signature, right token, or a webhook without auth) and valid.

The application and its pool live on an event loop in a thread (an anyio portal), so
hypothesis's synchronous examples can call it without a loop each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conveyor.api.app import create_app
from conveyor.api.routes.webhooks import DOOR_RESPONSES
from conveyor.config import Settings
from conveyor.domain.webhooks import signature
from conveyor.store.db import connect_sync, make_pool
from conveyor.transport.postgres import PostgresTransport
from conveyor.verbs.drive import run
from conveyor.verbs.webhooks import register

SECRET = "fuzz-secret"
TOKEN = "fuzz-token"
SCHEMA = {"type": "object", "properties": {"body": {"type": "object", "required": ["ok"]}}}


class Door:
    def __init__(self, portal: BlockingPortal, url: str) -> None:
        self.portal = portal
        self.url = url
        self.pool: Any = None
        self.client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        self.pool = make_pool(self.url, "conveyor", "test-webhooks-fuzz", 4)
        await self.pool.open(wait=True)
        app = create_app(Settings(api={"max_body_bytes": 4096}), self.pool, PostgresTransport(self.url, "conveyor"))
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self.pool is not None:
            await self.pool.close()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        assert self.client is not None
        client = self.client

        async def call() -> httpx.Response:
            return await client.post(path, content=body, headers=headers)

        return self.portal.call(call)


@pytest.fixture
def door(db_url: str) -> Iterator[Door]:
    with connect_sync(db_url, "conveyor", autocommit=True) as conn:
        for name, auth, schema in [("h", "hmac", None), ("b", "bearer", None), ("n", "none", SCHEMA)]:
            secret = SECRET if auth == "hmac" else None
            token = TOKEN if auth == "bearer" else None
            verb = register(name, auth=auth, secret=secret, token=token, payload_schema=schema, max_body_bytes=2048)
            run(conn, verb)
    with start_blocking_portal() as portal:
        d = Door(portal, db_url)
        portal.call(d.open)
        try:
            yield d
        finally:
            portal.call(d.close)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"ok": json_values}).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    st.binary(min_size=2040, max_size=2100),
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
content_types = st.sampled_from(
    ["application/json", "application/x-www-form-urlencoded", "text/plain", "application/xml", "", "x/y+json"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["h", "b", "n", "h", "b", "n", "missing"]) | header_text.filter(bool),
    body=bodies,
    sign=st.sampled_from(["right", "wrong", "none", "other-body"]),
    bearer=st.sampled_from(["right", "wrong", "none"]),
    content_type=content_types | header_text,
    key=st.none() | header_text,
    extra=st.dictionaries(st.sampled_from(["X-GitHub-Event", "Content-Length", "X-Other"]), header_text, max_size=2),
)
def test_the_door_never_fails_and_stores_only_what_it_accepts(
    door: Door, name: str, body: bytes, sign: str, bearer: str, content_type: str, key: str | None,
    extra: dict[str, str],
) -> None:  # fmt: skip
    headers = {k: v for k, v in extra.items() if k != "Content-Length" or v.isdigit()}
    headers["Content-Type"] = content_type
    if sign != "none":
        signed = body if sign == "right" else body + b" "
        headers["X-Hub-Signature-256"] = signature(SECRET if sign != "wrong" else "nope", signed)
    if bearer != "none":
        headers["Authorization"] = f"Bearer {TOKEN if bearer == 'right' else 'nope'}"
    if key is not None:
        headers["Idempotency-Key"] = key
    with connect_sync(door.url, "conveyor", autocommit=True) as conn:
        before = conn.execute("SELECT count(*) AS n FROM event").fetchone()
        path = "/api/v1/webhooks/" + "".join(c if c.isalnum() else "_" for c in name)
        response = door.post(path, body, headers)
        after = conn.execute("SELECT count(*) AS n FROM event").fetchone()
    assert before is not None
    assert after is not None
    event(f"status {response.status_code}")  # --hypothesis-show-statistics: every answer is reached
    assert response.status_code < 500, response.text
    assert response.status_code in DOOR_RESPONSES or response.status_code == 405, response.status_code
    assert response.headers["content-type"].startswith("application/json")
    if response.status_code != 202:
        assert after["n"] == before["n"], response.text
        return
    assert after["n"] - before["n"] in (0, 1)  # 0: a repeat
    authenticated = {"h": sign == "right", "b": bearer == "right", "n": True}
    assert authenticated.get(path.rsplit("/", 1)[1], False), (path, sign, bearer)
    assert len(body) <= 2048
    # Valid: what was stored is the JSON that was sent (GitHub's form encoding aside), and
    # webhook n's schema held.
    with connect_sync(door.url, "conveyor", autocommit=True) as conn:
        stored = conn.execute(
            "SELECT payload, payload::text AS text FROM event WHERE id = %s", (response.json()["event_id"],)
        ).fetchone()
    assert stored is not None
    if not body.startswith(b"payload="):
        # Numbers compared as decimals: jsonb keeps a JSON number's decimal value
        # (5.819922203916873e+16 comes back as 58199222039168730), which a binary float
        # does not equal.
        assert json.loads(stored["text"], parse_float=Decimal)["body"] == json.loads(body, parse_float=Decimal)
    if path.endswith("/n"):
        assert isinstance(stored["payload"]["body"], dict)
        assert "ok" in stored["payload"]["body"]
