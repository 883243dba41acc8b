"""Integration: the REST API's operator views of workers (list, cordon, uncordon, drain)
and dead letters (list, get, replay, purge), in-process against the per-test database.

State the API does not create itself (a running execution, a worker, a dead letter) is set
up with SQL, as the executor and worker would leave it (api_kit.py)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from integration.api_kit import (
    Api,
    dispatch,
    error_of,
    make_worker,
    request,
)

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
