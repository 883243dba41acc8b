"""The REST API in-process for the integration tests: ``Api`` (an ``httpx`` client over
ASGI with a token per role, and SQL on the test database), how a refusal reads, and state
the API does not create itself (a worker, a dispatch, a started or finished attempt) set up
with SQL, as the executor and worker would leave it. The ``api`` and ``settings`` fixtures
are in conftest.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.store.queries import Q

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
