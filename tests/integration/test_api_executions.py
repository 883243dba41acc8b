"""Integration: the REST API's executions in-process (``httpx`` over ASGI) against the
per-test database: requesting (and what is refused), reading, cancel and rerun.

State the API does not create itself (a running execution, a worker, a dead letter) is set
up with SQL, as the executor and worker would leave it (api_kit.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from conveyor.api.app import create_app
from conveyor.config import Settings
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import (
    FORM,
    LIMIT,
    SEEDS_BODY,
    Api,
    dispatch,
    error_of,
    finish,
    make_worker,
    request,
    start,
    status_of,
)

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
        (
            {"action_ref": "core.echo", "parameters": {"message": "a\u0000b"}},
            "parameters.message: contains a NUL character",
        ),
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
    assert body["cancelled_by"] == "test operator"  # who asked is kept, though its worker ended it


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


async def test_json_python_reads_but_postgresql_cannot_store_is_422(
    api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    for number in ("NaN", "Infinity"):
        body = '{"action_ref": "core.sleep", "parameters": {"seconds": ' + number + "}}"
        message = error_of(await api.post("/api/v1/executions", content=body), 422)
        # Refused at the door with its path (domain.storable), before PostgreSQL's own refusal.
        assert (
            message
            == f"invalid parameters for core.sleep: parameters.seconds: {number.lower()[:3]} is not a JSON number"
        )
    body = '{"action_ref": "core.sleep", "parameters": {"seconds": -Infinity}}'
    assert "parameters.seconds: -inf is not a JSON number" in error_of(
        await api.post("/api/v1/executions", content=body), 422
    )
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
