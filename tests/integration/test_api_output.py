"""Integration: an execution's live output through the REST API (issue #15), a page at a
time and as server-sent events that resume from ``Last-Event-ID`` and end with the
execution. The chunks are written by the worker's own fenced query (``append_output``)."""

from __future__ import annotations

import asyncio
import base64
import json

from conveyor.store.queries import Q
from integration.api_kit import TIMEOUT, Api, error_of, finish, make_worker, request, start
from integration.sse_kit import EventStream


async def append(api: Api, worker: int, eid: int, attempt: int, *chunks: tuple[str, bytes]) -> list[int]:
    params = {"worker": worker, "executions": [eid] * len(chunks), "attempts": [attempt] * len(chunks),
              "streams": [s for s, _ in chunks], "chunks": [d for _, d in chunks]}  # fmt: skip
    return [r["execution"] for r in await api.sql(Q["append_output"], params)]


async def test_a_page_of_output_with_its_cursor_and_encodings(api: Api) -> None:
    worker = await make_worker(api, "w")
    eid = await request(api, "core.noop")
    attempt = await start(api, eid, worker)
    assert await append(api, worker, eid, attempt, ("stdout", b"caf\xc3\xa9\n"), ("stderr", b"a\x00b\xff")) == [eid]
    assert await append(api, worker, eid, attempt + 1, ("stdout", b"not mine")) == []  # fenced: not its attempt
    assert await append(api, worker + 1, eid, attempt, ("stdout", b"not mine")) == []  # nor its worker

    page = (await api.get(f"/api/v1/executions/{eid}/output")).json()
    assert [(c["stream"], c["encoding"], c["data"]) for c in page["items"]] == [
        ("stdout", "utf-8", "café\n"),
        ("stderr", "base64", base64.b64encode(b"a\x00b\xff").decode()),
    ]
    assert page["ended"] is False
    assert page["next_cursor"] == page["items"][-1]["id"]
    first = page["items"][0]["id"]
    later = (await api.get(f"/api/v1/executions/{eid}/output", params={"after": first})).json()
    assert [c["stream"] for c in later["items"]] == ["stderr"]

    await finish(api, eid, worker, attempt)
    assert await append(api, worker, eid, attempt, ("stdout", b"late")) == []  # after its result: refused
    assert (await api.get(f"/api/v1/executions/{eid}/output")).json()["ended"] is True


async def test_the_stream_follows_resumes_and_ends_with_the_execution(api: Api) -> None:
    worker = await make_worker(api, "w")
    eid = await request(api, "core.noop")
    attempt = await start(api, eid, worker)
    await append(api, worker, eid, attempt, ("stdout", b"one\n"))
    path = f"/api/v1/executions/{eid}/output/stream"
    async with EventStream(api.app, api.auth("viewer"), path=path) as stream:
        one = await stream.wait_for(lambda e: e.get("event") == "output")
        assert json.loads(one["data"])["data"] == "one\n"
        await append(api, worker, eid, attempt, ("log", b"two\n"))  # while it follows
        two = await stream.wait_for(lambda e: e.get("event") == "output" and e["id"] != one["id"])
        assert (json.loads(two["data"])["stream"], int(two["id"]) > int(one["id"])) == ("log", True)
        await finish(api, eid, worker, attempt)
        await stream.wait_for(lambda e: e.get("event") == "end")
        async with asyncio.timeout(TIMEOUT):
            assert stream.task is not None
            await stream.task  # the endpoint closed the stream itself
        assert stream.ended

    # A reconnecting client resumes after the last event it saw; an ended execution's stream
    # is a plain body.
    resumed = await api.client.get(path, headers={**api.auth("viewer"), "Last-Event-ID": one["id"]})
    events = [b for b in resumed.text.split("\n\n") if b.startswith("id:") or b.startswith("event: end")]
    assert [e.splitlines()[0] for e in events] == [f"id: {two['id']}", "event: end"]


async def test_unknown_executions_and_missing_tokens_are_refused(api: Api) -> None:
    error_of(await api.get("/api/v1/executions/987654/output"), 404)
    error_of(await api.get("/api/v1/executions/987654/output/stream"), 404)
    error_of(await api.client.get("/api/v1/executions/1/output"), 401)
    error_of(await api.get("/api/v1/executions/1/output", params={"after": -1}), 422)
