"""Integration: what reads of large executions cost (issue #11, sizes).

Fifty executions with large parameters, output and returned values (15 MB in all): the list endpoint,
``Client.executions`` (what ``conveyor executions list`` prints) and the dashboard's list
carry summaries, small whatever the rows hold; ``GET /api/v1/executions/{id}`` still has
the full record; an execution's dashboard page shows its output once, bounded, and says
where the rest is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.api.app import create_app
from conveyor.api.auth import Role, create_token
from conveyor.api.dashboard.data import SHOWN
from conveyor.config import Settings
from conveyor.domain.models import ActionResult
from conveyor.sdk import Client
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport

KIB = 1024
ROWS = 50


@pytest.fixture
async def client(pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(), pool, transport)
    async with pool.connection() as conn:
        token, _ = await create_token(conn, "test viewer", Role.viewer)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers) as c:
        yield c


def big_result(n: int) -> dict[str, Any]:
    """What a command with a lot of output and a large returned value leaves."""
    stdout = f"BEGIN-STDOUT-{n}\n" + "o" * (200 * KIB)
    data = {"rows": ["d" * 100] * 1000, "n": n}
    error = "E" * 5000
    return ActionResult(True, 0, 1.5, stdout=stdout, stderr="s" * 1000, data=data, error=error).to_json()


async def finished_executions(pool: AsyncConnectionPool[Any], n: int = ROWS) -> list[int]:
    """``n`` executions of core.echo (with a 100 KiB message) finished with big results,
    through the scheduler's and the worker's own statements."""
    async with pool.connection() as conn:
        params = Jsonb({"message": "m" * 100_000})
        request = "SELECT request_execution('core.echo', %s) AS id"
        ids = [(await (await conn.execute(request, (params,))).fetchone())["id"] for _ in range(n)]
        worker = (await (await conn.execute(
            "INSERT INTO worker (name, runtimes, actions, capacity, stale_after, lock_grace, lock_epoch,"
            " last_heartbeat) VALUES ('w', '{python}', '{core.echo}', 100, 3600, 1, pg_postmaster_start_time(),"
            " now()) RETURNING id"
        )).fetchone())["id"]  # fmt: skip
        await conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = ANY(%s)", (ids,))
        await conn.execute(Q["assign"], {"ids": ids, "workers": [worker] * n, "executor": "t"})
        rows = await (await conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": n})).fetchall()
        finish = {"ids": [r["id"] for r in rows], "attempts": [r["attempt"] for r in rows],
                  "statuses": ["completed"] * n, "outcomes": ["completed"] * n, "delays": [None] * n,
                  "results": [Jsonb(big_result(r["id"])) for r in rows], "errors": [None] * n,
                  "worker": worker}  # fmt: skip
        assert len(await (await conn.execute(Q["finish"], finish)).fetchall()) == n
    return sorted(ids)


async def test_lists_carry_summaries_and_one_execution_its_full_record(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Any], db_url: str
) -> None:
    ids = await finished_executions(pool)
    listed = await client.get("/api/v1/executions", params={"limit": ROWS})
    assert listed.status_code == 200, listed.text
    assert len(listed.content) < 100_000, len(listed.content)  # the rows hold over 15 MB
    items = listed.json()["items"]
    assert [i["id"] for i in items] == ids[::-1]
    item = items[0]
    assert "parameters" not in item
    assert "result" not in item
    assert item["parameters_preview"] == '{"message": "' + "m" * 187
    assert item["parameters_truncated"] is True
    assert item["parameters_size"] > 0
    assert item["result_size"] > 0
    summary = item["result_summary"]
    assert summary["succeeded"] is True
    assert summary["exit_code"] == 0
    assert summary["stdout_truncated"] is False
    assert summary["error"] == "E" * 300 + "…"
    assert not {"stdout", "stderr", "data"} & summary.keys()

    full = await client.get(f"/api/v1/executions/{ids[0]}")
    assert full.status_code == 200
    record = full.json()
    assert record["parameters"] == {"message": "m" * 100_000}
    assert record["result"] == big_result(ids[0])

    with Client(db_url) as sdk:
        summaries = sdk.executions(limit=ROWS)
    assert [s.id for s in summaries] == ids[::-1]
    assert len(json.dumps([dataclasses.asdict(s) for s in summaries], default=str)) < 100_000

    page = await client.get("/executions")
    assert page.status_code == 200
    assert len(page.content) < 200_000, len(page.content)
    assert all(f'data-id="{eid}"' in page.text for eid in ids)


async def test_an_execution_page_shows_its_output_once_and_bounded(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Any]
) -> None:
    [eid] = await finished_executions(pool, 1)
    for path in [f"/executions/{eid}", f"/_live/executions/{eid}"]:
        page = await client.get(path)
        assert page.status_code == 200, page.text
        # Parameters, stdout, returned value and the rest of the result: each at most SHOWN characters.
        assert len(page.content) < 5 * SHOWN + 50_000, len(page.content)
        assert page.text.count(f"BEGIN-STDOUT-{eid}") == 1  # stdout shown once, not again in the result
        assert 'id="execution-stdout"' in page.text
        assert 'id="execution-data"' in page.text
        assert f"The first {SHOWN} of {len(big_result(eid)['stdout'])} characters" in page.text
        assert f'href="/api/v1/executions/{eid}"' in page.text
