"""Integration: the REST API in-process (``httpx`` over ASGI) against the per-test database.

State the API does not create itself (a running execution, a worker, a dead letter) is set
up with SQL, as the executor and worker would leave it. The event stream, which never ends
by itself, is driven by a small ASGI client that disconnects when the test is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.api import auth
from conveyor.api.app import create_app
from conveyor.api.auth import Role, create_token
from conveyor.config import Settings
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from support.polling import until

# The seeds' example, byte for byte: `curl -X POST ... -d '{...}'` sends it as a form.
SEEDS_BODY = '{"action_ref": "core.echo", "parameters": {"message": "test"}}'
FORM = "application/x-www-form-urlencoded"
LIMIT = 2048  # api.max_body_bytes for these tests
TIMEOUT = 10.0


@dataclass
class Api:
    app: FastAPI
    client: httpx.AsyncClient
    pool: AsyncConnectionPool[Any]
    tokens: dict[str, str] = field(default_factory=dict)

    def auth(self, role: str = "admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    async def get(self, path: str, role: str = "viewer", **kwargs: Any) -> httpx.Response:
        return await self.client.get(path, headers=self.auth(role), **kwargs)

    async def post(self, path: str, role: str = "operator", **kwargs: Any) -> httpx.Response:
        return await self.client.post(path, headers={**self.auth(role), **kwargs.pop("headers", {})}, **kwargs)

    async def delete(self, path: str, role: str = "admin", **kwargs: Any) -> httpx.Response:
        return await self.client.delete(path, headers=self.auth(role), **kwargs)

    async def sql(self, query: str, params: Any = None) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return list(await cur.fetchall()) if cur.description else []

    async def one(self, query: str, params: Any = None) -> dict[str, Any]:
        rows = await self.sql(query, params)
        assert len(rows) == 1, rows
        return rows[0]


@pytest.fixture
def settings() -> Settings:
    return Settings(api={"max_body_bytes": LIMIT, "stream_interval": 0.05})


@pytest.fixture
async def api(settings: Settings, pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> AsyncIterator[Api]:
    app = create_app(settings, pool, transport)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        api = Api(app, client, pool)
        async with pool.connection() as conn:
            for role in Role:
                api.tokens[role.name], _ = await create_token(conn, f"test {role.name}", role)
        yield api


def error_of(response: httpx.Response, status: int) -> str:
    """The JSON error message of a refusal with this status."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body.get("error"), str), body
    assert body["error"], body
    return str(body["error"])


# -- state set up as the executor and worker would leave it ---------------------------------


async def request(api: Api, ref: str = "core.echo", parameters: dict[str, Any] | None = None) -> int:
    params = {"message": "hi"} if parameters is None and ref == "core.echo" else (parameters or {})
    row = await api.one("SELECT request_execution(%s, %s) AS id", (ref, Jsonb(params)))
    return int(row["id"])


async def make_worker(api: Api, name: str) -> int:
    row = await api.one(
        "INSERT INTO worker (name, runtimes, actions, capacity, stale_after, lock_grace, lock_epoch, last_heartbeat)"
        " VALUES (%s, '{python}', '{core.echo,core.noop,core.sleep}', 10, 3600, 1, pg_postmaster_start_time(),"
        " now()) RETURNING id",
        (name,),
    )
    return int(row["id"])


async def dispatch(api: Api, eid: int, worker: int) -> None:
    """requested -> scheduling -> scheduled on ``worker`` (a new attempt), as the scheduler does."""
    async with api.pool.connection() as conn:
        await conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = %s", (eid,))
        rows = await (await conn.execute(Q["assign"], {"ids": [eid], "workers": [worker], "executor": "t"})).fetchall()
    assert len(rows) == 1


async def start(api: Api, eid: int, worker: int) -> int:
    """Dispatched and claimed by the worker: running. Returns the attempt."""
    await dispatch(api, eid, worker)
    async with api.pool.connection() as conn:
        rows = await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 100})).fetchall()
    assert [r["id"] for r in rows] == [eid]
    return int(rows[0]["attempt"])


async def finish(api: Api, eid: int, worker: int, attempt: int, outcome: str = "completed") -> list[int]:
    """The worker's fenced finish of a run (the ``finish`` query)."""
    result = Jsonb({"succeeded": outcome == "completed"})
    params = {"ids": [eid], "attempts": [attempt], "statuses": [outcome], "outcomes": [outcome], "delays": [None],
              "results": [result], "errors": [None], "worker": worker}  # fmt: skip
    return [r["id"] for r in await api.sql(Q["finish"], params)]


async def status_of(api: Api, eid: int) -> str:
    return str((await api.one("SELECT status FROM execution WHERE id = %s", (eid,)))["status"])


# -- requesting -------------------------------------------------------------------------------


async def test_the_seeds_request_verbatim_is_created_requested(api: Api) -> None:
    response = await api.client.post(
        "/api/v1/executions", content=SEEDS_BODY, headers={**api.auth("admin"), "Content-Type": FORM}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["action_ref"] == "core.echo"
    assert body["parameters"] == {"message": "test"}
    assert body["status"] == "requested"
    assert body["attempts"] == []
    row = await api.one("SELECT status, action_ref, parameters FROM execution WHERE id = %s", (body["id"],))
    assert row == {"status": "requested", "action_ref": "core.echo", "parameters": {"message": "test"}}


async def test_request_as_json_and_the_roles_that_may(api: Api) -> None:
    body = {"action_ref": "core.noop", "parameters": {}}
    for role in ("operator", "admin"):
        response = await api.post("/api/v1/executions", role=role, json=body)
        assert response.status_code == 201, response.text
    assert "operator" in error_of(await api.post("/api/v1/executions", role="viewer", json=body), 403)
    response = await api.post("/api/v1/executions", json={"action_ref": "core.noop"})  # parameters default to {}
    assert response.status_code == 201, response.text


async def test_malformed_json_is_400_with_the_parser_message(api: Api) -> None:
    for content in ('{"action_ref": "core.echo",', "{'action_ref': 'core.echo'}", "not json"):
        for content_type in (FORM, "application/json", "text/plain"):
            message = error_of(
                await api.post("/api/v1/executions", content=content, headers={"Content-Type": content_type}), 400
            )
            assert message.startswith("malformed JSON body"), message
    assert await api.sql("SELECT id FROM execution") == []


async def test_unknown_action_and_bad_parameters_are_422_saying_what_is_wrong(api: Api) -> None:
    cases: list[tuple[Any, str]] = [
        ({"action_ref": "nope.nothing", "parameters": {}}, "unknown action 'nope.nothing'"),
        ({"action_ref": "core.echo", "parameters": {"message": 5}}, "invalid parameters for core.echo"),
        ({"action_ref": "core.echo", "parameters": {}}, "message"),
        ({"action_ref": "core.echo", "parameters": {"message": "x", "extra": 1}}, "extra"),
        ({"action_ref": "core.sleep", "parameters": {"seconds": -1}}, "seconds"),
        ({"action_ref": "core.echo", "parameters": {"message": "a\u0000b"}}, "invalid value"),
        ({"action_ref": "core.echo", "parameters": [1]}, "parameters"),
        ({"action_ref": "core.echo", "params": {}}, "params"),
        ({"action_ref": ""}, "action_ref"),
        ({}, "action_ref"),
        ([], "body"),
        ("core.echo", "body"),
    ]
    for body, text in cases:
        message = error_of(await api.post("/api/v1/executions", content=json.dumps(body)), 422)
        assert text in message, (body, message)
    assert "body" in error_of(await api.post("/api/v1/executions", content=b""), 422)
    assert await api.sql("SELECT id FROM execution") == []


async def test_bodies_over_the_limit_are_413_with_or_without_content_length(api: Api) -> None:
    big = json.dumps({"action_ref": "core.echo", "parameters": {"message": "x" * LIMIT}}).encode()
    message = error_of(await api.post("/api/v1/executions", content=big), 413)
    assert str(LIMIT) in message
    assert "api.max_body_bytes" in message

    async def chunked(data: bytes, size: int = 500) -> AsyncIterator[bytes]:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    response = await api.post("/api/v1/executions", content=chunked(big))
    assert "content-length" not in response.request.headers
    assert str(LIMIT) in error_of(response, 413)
    small = chunked(SEEDS_BODY.encode(), 10)  # under the limit, streamed: accepted
    response = await api.post("/api/v1/executions", content=small, headers={"Content-Type": FORM})
    assert response.status_code == 201, response.text
    assert len(await api.sql("SELECT id FROM execution")) == 1


# -- reading ------------------------------------------------------------------------------


async def test_list_filters_and_cursor_pagination(api: Api) -> None:
    worker = await make_worker(api, "w-list")
    echoes = [await request(api) for _ in range(5)]
    noops = [await request(api, "core.noop") for _ in range(2)]
    running = echoes[1]
    await start(api, running, worker)
    await api.sql("UPDATE execution SET status = 'cancelled', ended = now() WHERE id = %s", (noops[0],))
    old = echoes[0]
    await api.sql("UPDATE execution SET created = now() - interval '2 days' WHERE id = %s", (old,))
    everything = sorted([*echoes, *noops], reverse=True)

    async def ids(**params: Any) -> list[int]:
        response = await api.get("/api/v1/executions", params=params)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    assert await ids() == everything
    assert await ids(status="running") == [running]
    assert await ids(status=["running", "cancelled"]) == sorted([running, noops[0]], reverse=True)
    assert await ids(status="requested", action="core.noop") == [noops[1]]
    assert await ids(action="core.noop") == sorted(noops, reverse=True)
    assert await ids(worker="w-list") == [running]
    assert await ids(worker="nobody") == []
    day_ago = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert await ids(until=day_ago) == [old]
    assert await ids(since=day_ago) == [i for i in everything if i != old]
    assert await ids(since=day_ago, status="running") == [running]
    page = (await api.get("/api/v1/executions", params={"status": "running"})).json()["items"][0]
    assert page["worker_name"] == "w-list"
    assert page["attempt"] == 1

    seen: list[int] = []
    params: dict[str, Any] = {"limit": 3}
    while True:
        response = await api.get("/api/v1/executions", params=params)
        body = response.json()
        assert len(body["items"]) <= 3
        seen += [item["id"] for item in body["items"]]
        if body["next_cursor"] is None:
            break
        assert body["next_cursor"] == body["items"][-1]["id"]
        params["before"] = body["next_cursor"]
    assert seen == everything

    for bad in ({"status": "bogus"}, {"limit": 0}, {"limit": 501}, {"since": "yesterday"}, {"before": 10**30}):
        assert error_of(await api.get("/api/v1/executions", params=bad), 422).startswith("invalid request")


async def test_get_shows_the_attempts_and_unknown_ids_are_404(api: Api) -> None:
    worker = await make_worker(api, "w-get")
    eid = await request(api)
    await start(api, eid, worker)
    response = await api.get(f"/api/v1/executions/{eid}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "running"
    assert body["worker_name"] == "w-get"
    [attempt] = body["attempts"]
    assert attempt["attempt"] == 1
    assert attempt["worker_name"] == "w-get"
    assert attempt["started"] is not None
    assert attempt["outcome"] is None

    for missing in (eid + 1000, 0, -1, 2**62, 2**63, 10**30):
        assert error_of(await api.get(f"/api/v1/executions/{missing}"), 404) == f"no execution with id {missing}"
    for bad in ("abc", "1.5", "1e3"):
        error_of(await api.get(f"/api/v1/executions/{bad}"), 422)


async def test_huge_and_negative_ids_are_4xx_everywhere(api: Api) -> None:
    for n in (10**30, -(10**30), 2**63, 0):
        for method, path in (
            ("POST", f"/api/v1/executions/{n}/cancel"),
            ("POST", f"/api/v1/executions/{n}/rerun"),
            ("GET", f"/api/v1/dead-letters/{n}"),
            ("POST", f"/api/v1/dead-letters/{n}/replay"),
            ("DELETE", f"/api/v1/tokens/{n}"),
        ):
            response = await api.client.request(method, path, headers=api.auth("admin"))
            error_of(response, 404)
    error_of(await api.get("/api/v1/dead-letters", params={"execution": 10**30}), 422)
    error_of(await api.delete("/api/v1/dead-letters", params={"execution": 10**30}), 422)


async def test_nul_characters_anywhere_are_422(api: Api) -> None:
    """PostgreSQL text cannot hold NUL: refused with a message, never a 500."""
    for params in ({"action": "a\x00b"}, {"worker": "\x00"}):
        assert "NUL" in error_of(await api.get("/api/v1/executions", params=params), 422)
    assert "NUL" in error_of(await api.get("/api/v1/dead-letters", params={"queue": "q\x00"}), 422)
    assert "NUL" in error_of(await api.get("/api/v1/actions/core.e%00cho"), 422)
    assert "NUL" in error_of(await api.post("/api/v1/workers/w%00/cordon", role="admin"), 422)
    response = await api.post("/api/v1/tokens", role="admin", json={"name": "a\x00", "role": "viewer"})
    assert "NUL" in error_of(response, 422)
    response = await api.post("/api/v1/executions", json={"action_ref": "core.\x00echo"})
    assert "NUL" in error_of(response, 422)


async def test_actions_list_and_get_with_the_parameter_schema(api: Api) -> None:
    response = await api.get("/api/v1/actions")
    assert response.status_code == 200, response.text
    refs = [a["ref"] for a in response.json()]
    assert {"core.echo", "core.noop", "core.sleep", "core.local"} <= set(refs)
    echo = (await api.get("/api/v1/actions/core.echo")).json()
    assert echo["parameters_schema"]["required"] == ["message"]
    assert echo["parameters_schema"]["properties"]["message"]["type"] == "string"
    assert "nope.nothing" in error_of(await api.get("/api/v1/actions/nope.nothing"), 404)


# -- cancel and rerun -----------------------------------------------------------------------


async def test_cancel_requested_and_scheduled_is_immediate(api: Api) -> None:
    worker = await make_worker(api, "w-cancel")
    requested = await request(api)
    response = await api.post(f"/api/v1/executions/{requested}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == {"id": requested, "status": "cancelled"}
    row = await api.one("SELECT status, ended, result FROM execution WHERE id = %s", (requested,))
    assert row["status"] == "cancelled"
    assert row["ended"] is not None
    assert row["result"]["error"] == "cancelled by test operator"

    scheduled = await request(api)
    await dispatch(api, scheduled, worker)
    response = await api.post(f"/api/v1/executions/{scheduled}/cancel")
    assert response.json() == {"id": scheduled, "status": "cancelled"}
    attempt = await api.one("SELECT outcome, ended, error FROM execution_attempt WHERE execution = %s", (scheduled,))
    assert attempt["outcome"] == "cancelled"
    assert attempt["ended"] is not None
    assert attempt["error"] == "cancelled by test operator"
    # The worker's claim finds nothing to run any more.
    assert await api.sql(Q["claim_scheduled"], {"worker": worker, "limit": 10}) == []

    assert "is cancelled" in error_of(await api.post(f"/api/v1/executions/{requested}/cancel"), 409)


async def test_cancel_running_is_canceling_until_its_worker_finishes_it(api: Api) -> None:
    worker = await make_worker(api, "w-run")
    eid = await request(api)
    attempt = await start(api, eid, worker)
    response = await api.post(f"/api/v1/executions/{eid}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == {"id": eid, "status": "canceling"}
    row = await api.one("SELECT status, worker, ended FROM execution WHERE id = %s", (eid,))
    assert row == {"status": "canceling", "worker": worker, "ended": None}
    assert await api.sql(Q["canceling_on_worker"], {"worker": worker}) == [{"id": eid, "attempt": attempt}]
    again = await api.post(f"/api/v1/executions/{eid}/cancel")  # asked twice: the same answer
    assert (again.status_code, again.json()) == (200, {"id": eid, "status": "canceling"})

    # The run ends (here: it had just completed); the user's cancellation stands.
    assert await finish(api, eid, worker, attempt, "completed") == [eid]
    assert await status_of(api, eid) == "cancelled"
    body = (await api.get(f"/api/v1/executions/{eid}")).json()
    assert body["status"] == "cancelled"
    assert body["attempts"][0]["outcome"] == "cancelled"


async def test_cancel_finished_is_409_and_unknown_404(api: Api) -> None:
    worker = await make_worker(api, "w-done")
    eid = await request(api)
    attempt = await start(api, eid, worker)
    await finish(api, eid, worker, attempt)
    assert await status_of(api, eid) == "completed"
    message = error_of(await api.post(f"/api/v1/executions/{eid}/cancel"), 409)
    assert message == f"execution {eid} is completed: nothing to cancel"
    assert await status_of(api, eid) == "completed"
    error_of(await api.post(f"/api/v1/executions/{eid + 1}/cancel"), 404)


async def test_rerun_requests_the_same_action_with_the_same_parameters(api: Api) -> None:
    worker = await make_worker(api, "w-rerun")
    eid = await request(api, "core.echo", {"message": "again"})
    attempt = await start(api, eid, worker)
    await finish(api, eid, worker, attempt, "failed")
    response = await api.post(f"/api/v1/executions/{eid}/rerun")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["id"] != eid
    assert (body["action_ref"], body["parameters"], body["status"]) == ("core.echo", {"message": "again"}, "requested")
    assert await status_of(api, eid) == "failed"
    error_of(await api.post(f"/api/v1/executions/{eid + 100}/rerun"), 404)


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


# -- the event stream ---------------------------------------------------------------------------


class EventStream:
    """A GET of the stream straight over ASGI: events as they are sent, then a disconnect
    (``httpx``'s ASGI transport waits for the whole body, which never comes)."""

    def __init__(self, app: FastAPI, headers: dict[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in {"host": "test", **headers}.items()]
        self.status: int | None = None
        self.buffer = ""
        self.events: list[dict[str, str]] = []
        self.changed = asyncio.Event()
        self.gone = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventStream:
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": "/api/v1/executions/stream",
                 "raw_path": b"/api/v1/executions/stream", "query_string": b"", "root_path": "",
                 "headers": self.headers, "client": ("127.0.0.1", 50000), "server": ("test", 80),
                 "state": {}}  # fmt: skip
        asked = False

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body":
                self.buffer += message.get("body", b"").decode()
                while "\n\n" in self.buffer:
                    block, self.buffer = self.buffer.split("\n\n", 1)
                    fields: dict[str, str] = {}
                    for line in block.split("\n"):
                        name, _, value = line.partition(":")
                        fields[name or "comment"] = value.strip()
                    self.events.append(fields)
            self.changed.set()

        self.task = asyncio.create_task(self.app(scope, receive, send))
        return self

    async def wait_for(self, predicate: Callable[[dict[str, str]], bool], timeout: float = TIMEOUT) -> dict[str, str]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                assert self.task is not None
                if self.task.done():
                    raise AssertionError(f"the stream ended: {self.task.result()!r}, {self.events}")
                self.changed.clear()
                await self.changed.wait()

    async def __aexit__(self, *exc: object) -> None:
        self.gone.set()
        assert self.task is not None
        async with asyncio.timeout(TIMEOUT):  # the endpoint stops once the client is gone
            await self.task


def execution_event(eid: int, status: str) -> Callable[[dict[str, str]], bool]:
    def matches(event: dict[str, str]) -> bool:
        if event.get("event") != "execution":
            return False
        data = json.loads(event["data"])
        return bool(data["id"] == eid and data["status"] == status)

    return matches


async def test_the_stream_sends_an_event_per_change(api: Api) -> None:
    before = await request(api)  # before the stream started: not sent
    async with EventStream(api.app, api.auth("viewer")) as stream:
        await stream.wait_for(lambda e: "comment" in e)
        assert stream.status == 200
        eid = (await api.post("/api/v1/executions", json={"action_ref": "core.noop"})).json()["id"]
        created = await stream.wait_for(execution_event(eid, "requested"))
        data = json.loads(created["data"])
        assert data["action_ref"] == "core.noop"
        assert created["id"] == f"{datetime.fromisoformat(data['updated']).isoformat()}|{eid}"
        await api.post(f"/api/v1/executions/{eid}/cancel")
        await stream.wait_for(execution_event(eid, "cancelled"))
        assert all(json.loads(e["data"])["id"] != before for e in stream.events if e.get("event") == "execution")

    # Resuming after the last event sent: later changes come (a few earlier ones may come again).
    later = await request(api)
    async with EventStream(api.app, {**api.auth("viewer"), "Last-Event-ID": created["id"]}) as stream:
        await stream.wait_for(execution_event(later, "requested"))
        await stream.wait_for(execution_event(eid, "cancelled"))


async def test_the_stream_needs_a_token_and_survives_odd_last_event_ids(api: Api) -> None:
    error_of(await api.client.get("/api/v1/executions/stream"), 401)
    for odd in ("garbage", "|", "2020-01-01T00:00:00|1", "0001-01-01T00:00:00+00:00|1",
                f"2020-01-01T00:00:00+00:00|{10**30}", "9999-12-31T23:59:59+00:00|1"):  # fmt: skip
        async with EventStream(api.app, {**api.auth("viewer"), "Last-Event-ID": odd}) as stream:
            await stream.wait_for(lambda e: "comment" in e)
            assert stream.status == 200
            eid = await request(api, "core.noop")
            await stream.wait_for(execution_event(eid, "requested"))


async def test_the_stream_outlives_a_database_outage(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    async with EventStream(api.app, api.auth("viewer")) as stream:
        await stream.wait_for(lambda e: "comment" in e)
        failures = 0
        failed_thrice = asyncio.Event()

        @contextlib.asynccontextmanager
        async def unreachable(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            nonlocal failures
            failures += 1
            if failures >= 3:
                failed_thrice.set()
            raise psycopg.OperationalError("connection refused (simulated)")
            yield

        monkeypatch.setattr(api.pool, "connection", unreachable)
        async with asyncio.timeout(TIMEOUT):
            await failed_thrice.wait()
        monkeypatch.undo()
        assert stream.task is not None
        assert not stream.task.done()
        eid = await request(api, "core.noop")
        await stream.wait_for(execution_event(eid, "requested"))


# -- workers ------------------------------------------------------------------------------------


async def test_workers_list_cordon_uncordon_drain(api: Api) -> None:
    worker = await make_worker(api, "w-a")
    await make_worker(api, "w-b")
    eid = await request(api)
    await dispatch(api, eid, worker)

    response = await api.get("/api/v1/workers")
    assert response.status_code == 200, response.text
    [a] = [w for w in response.json() if w["name"] == "w-a"]
    assert a["status"] == "active"
    assert a["cordoned"] is False
    assert a["load"] == 1
    assert 0 <= a["heartbeat_age"] < 60

    response = await api.post("/api/v1/workers/w-a/cordon", role="admin")
    assert response.json() == {"name": "w-a", "status": "active", "cordoned": True, "handed_back": None}
    assert (await api.one("SELECT cordoned FROM worker WHERE id = %s", (worker,)))["cordoned"] is True
    response = await api.post("/api/v1/workers/w-a/uncordon", role="admin")
    assert response.json()["cordoned"] is False
    assert (await api.one("SELECT cordoned FROM worker WHERE id = %s", (worker,)))["cordoned"] is False

    response = await api.post("/api/v1/workers/w-a/drain", role="admin")
    assert response.json() == {"name": "w-a", "status": "active", "cordoned": True, "handed_back": 1}
    row = await api.one("SELECT status, worker, attempt FROM execution WHERE id = %s", (eid,))
    assert row == {"status": "requested", "worker": None, "attempt": 0}
    assert await api.sql("SELECT * FROM execution_attempt WHERE execution = %s", (eid,)) == []

    for action in ("cordon", "uncordon", "drain"):
        assert "'nobody'" in error_of(await api.post(f"/api/v1/workers/nobody/{action}", role="admin"), 404)
        error_of(await api.post(f"/api/v1/workers/w-b/{action}", role="operator"), 403)


# -- dead letters ---------------------------------------------------------------------------------


async def insert_dead_letter(
    api: Api, *, reason: str = "expired", resolution: str | None = "rescheduled", execution: int | None = None,
    payload: dict[str, Any] | None = None, routing_key: str = "execution.requested",
) -> int:  # fmt: skip
    body = payload if payload is not None else {
        "message_id": "m", "message_type": "execution.requested", "created": "2026-01-01T00:00:00+00:00",
        "payload": {"execution_ids": []},
    }  # fmt: skip
    row = await api.one(
        "INSERT INTO dead_letter (dedupe_key, message_id, transport, queue, routing_key, reason, message_type, payload,"
        " execution, resolution, resolved) VALUES (gen_random_uuid()::text, 'm', 'postgres',"
        " 'conveyor.executor.requests', %s, %s, %s, %s, %s, %s, CASE WHEN %s::text IS NULL THEN NULL ELSE now() END)"
        " RETURNING id",
        (routing_key, reason, body.get("message_type"), Jsonb(body), execution, resolution, resolution),
    )
    return int(row["id"])


async def test_dead_letters_list_get_replay_purge(api: Api) -> None:
    resolved = await insert_dead_letter(api)
    pending = await insert_dead_letter(api, reason="poison", resolution=None, execution=7)
    raw = await insert_dead_letter(api, reason="rejected", resolution=None, payload={"raw": "not a message"})

    async def ids(**params: Any) -> list[int]:
        response = await api.get("/api/v1/dead-letters", params=params)
        assert response.status_code == 200, response.text
        return [d["id"] for d in response.json()]

    assert await ids() == [raw, pending, resolved]
    assert await ids(reason="poison") == [pending]
    assert await ids(resolution="pending") == [raw, pending]
    assert await ids(resolution="rescheduled") == [resolved]
    assert await ids(execution=7) == [pending]
    assert await ids(since=3600, limit=1) == [raw]
    error_of(await api.get("/api/v1/dead-letters", params={"reason": "bogus"}), 422)

    response = await api.get(f"/api/v1/dead-letters/{pending}")
    assert response.status_code == 200
    assert response.json()["payload"]["message_type"] == "execution.requested"
    error_of(await api.get(f"/api/v1/dead-letters/{raw + 100}"), 404)

    response = await api.post(f"/api/v1/dead-letters/{pending}/replay")
    assert response.json() == {"id": pending, "resolution": "replayed"}
    row = await api.one("SELECT resolution, resolved_by FROM dead_letter WHERE id = %s", (pending,))
    assert row == {"resolution": "replayed", "resolved_by": "api:test operator"}
    assert "cannot be replayed" in error_of(await api.post(f"/api/v1/dead-letters/{raw}/replay"), 409)
    error_of(await api.post(f"/api/v1/dead-letters/{raw + 100}/replay"), 404)
    error_of(await api.post(f"/api/v1/dead-letters/{resolved}/replay", role="viewer"), 403)

    assert "needs a filter" in error_of(await api.delete("/api/v1/dead-letters", role="operator"), 400)
    response = await api.delete("/api/v1/dead-letters", role="operator", params={"resolution": "replayed"})
    assert response.json() == {"deleted": 1}
    response = await api.delete("/api/v1/dead-letters", role="operator", params={"all": "true"})
    assert response.json() == {"deleted": 1}  # resolved ones only: the pending one stays
    assert await ids() == [raw]
    response = await api.delete("/api/v1/dead-letters", role="operator", params={"all": "true", "include_pending": 1})
    assert response.json() == {"deleted": 1}
    assert await ids() == []


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


async def test_json_python_reads_but_postgresql_cannot_store_is_422(
    api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    for number in ("NaN", "Infinity"):
        body = '{"action_ref": "core.sleep", "parameters": {"seconds": ' + number + "}}"
        message = error_of(await api.post("/api/v1/executions", content=body), 422)
        assert message == f'invalid value: invalid input syntax for type json (Token "{number}" is invalid.)'
    body = '{"action_ref": "core.sleep", "parameters": {"seconds": -Infinity}}'
    assert "-inf is less than the minimum" in error_of(await api.post("/api/v1/executions", content=body), 422)
    # Nesting deeper than the parsers go: refused, whatever the depth.
    roomy = create_app(Settings(), pool, transport)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=roomy), base_url="http://test") as client:
        for depth in (50, 500, 900, 2000, 100_000):
            for ref in ("core.noop", "core.echo"):
                nested = '{"a":' * depth + "1" + "}" * depth
                body = f'{{"action_ref": "{ref}", "parameters": {{"message": {nested}}}}}'
                response = await client.post("/api/v1/executions", content=body, headers=api.auth("operator"))
                assert response.status_code in (400, 422), (depth, ref, response.status_code, response.text[:300])
    assert await api.sql("SELECT id FROM execution") == []
