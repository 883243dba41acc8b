"""Integration: the REST API's event stream in-process against the per-test database.
The stream, which never ends by itself, is driven by a small ASGI client that disconnects
when the test is done.

State the API does not create itself (a running execution, a worker, a dead letter) is set
up with SQL, as the executor and worker would leave it (api_kit.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest

from integration.api_kit import TIMEOUT, Api, error_of, request
from integration.sse_kit import EventStream


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
