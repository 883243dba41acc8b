"""Delayed executions (issue #13): not_before in SQL, the SDK, REST and the CLI; shown as
waiting; and placed at its time by a running executor, not at its next poll."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.domain.delays import DelayError
from conveyor.executor.service import ExecutorService
from conveyor.sdk import Client, request_execution
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import Api, error_of
from integration.builders import Conn, add_worker
from integration.test_cli_sdk_workflows import Cli, cli  # noqa: F401 - the fixture
from support.polling import until

HI = {"message": "hi"}


def waiting(conn: Conn, eid: int) -> dict[str, Any]:
    row = conn.execute(
        "SELECT status, not_before, extract(epoch FROM not_before - now())::float8 AS left FROM execution "
        "WHERE id = %s",
        (eid,),
    ).fetchone()
    assert row is not None
    return row


def db_now(conn: Conn) -> datetime:
    row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


def test_sql_takes_not_before_and_old_calls_work(conn: Conn) -> None:
    later = conn.execute(
        "SELECT request_execution('core.echo', %s, not_before => now() + interval '1 hour') AS id", (json.dumps(HI),)
    ).fetchone()
    assert later is not None
    row = waiting(conn, later["id"])
    assert row["status"] == "requested"
    assert 3590 < row["left"] <= 3600
    # The shorter calls of before keep working, without a delay.
    plain = conn.execute("SELECT request_execution('core.echo', %s) AS id", (json.dumps(HI),)).fetchone()
    assert plain is not None
    assert waiting(conn, plain["id"])["not_before"] is None
    once = conn.execute(
        "SELECT * FROM request_execution_once('core.echo', %s, NULL, 'k1')", (json.dumps(HI),)
    ).fetchone()
    assert once is not None
    assert waiting(conn, once["execution_id"])["not_before"] is None
    # A time already past is no delay at all.
    past = conn.execute(
        "SELECT request_execution('core.echo', %s, not_before => now() - interval '1 minute') AS id",
        (json.dumps(HI),),
    ).fetchone()
    assert past is not None
    assert waiting(conn, past["id"])["not_before"] is None


def test_the_idempotency_check_ignores_not_before(conn: Conn) -> None:
    first = request_execution(conn, "core.echo", HI, idempotency_key="k", delay=timedelta(seconds=30))
    again = request_execution(conn, "core.echo", HI, idempotency_key="k", delay=timedelta(seconds=31))
    assert again == first


def test_sdk_not_before_and_delay_use_the_database_clock(conn: Conn, db_url: str) -> None:
    at = db_now(conn) + timedelta(minutes=10)
    eid = request_execution(conn, "core.echo", HI, not_before=at)
    assert waiting(conn, eid)["not_before"] == at
    with Client(db_url) as client:
        delayed = client.request("core.echo", HI, delay=timedelta(seconds=90))
        shown = client.get(delayed)
        assert shown.status == "requested"
        assert shown.not_before is not None
        assert 89 < waiting(conn, delayed)["left"] <= 90
        assert [e.not_before is not None for e in client.executions(limit=2)] == [True, True]
        with pytest.raises(DelayError, match="no UTC offset"):
            client.request("core.echo", HI, not_before=datetime(2030, 1, 1))
        with pytest.raises(DelayError, match="not both"):
            client.request("core.echo", HI, not_before=at, delay=timedelta(seconds=1))
        with pytest.raises(DelayError, match="negative"):
            client.request("core.echo", HI, delay=timedelta(seconds=-1))
    # Once its time has passed, readers no longer call it waiting.
    conn.execute("UPDATE execution SET not_before = now() - interval '1 second' WHERE id = %s", (eid,))
    with Client(db_url) as client:
        assert client.get(eid).not_before is None


async def test_rest_not_before(api: Api) -> None:
    row = await api.one("SELECT now() + interval '1 hour' AS at")
    at = row["at"]
    response = await api.post(
        "/api/v1/executions",
        content=json.dumps({"action_ref": "core.echo", "parameters": HI, "not_before": at.isoformat()}),
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["status"] == "requested"
    assert datetime.fromisoformat(body["not_before"]) == at
    listed = (await api.get("/api/v1/executions")).json()["items"]
    assert datetime.fromisoformat(listed[0]["not_before"]) == at
    # The dashboard's list and page show it waiting, with its time (UTC).
    shown = f"requested (at {at.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')}"
    for page in ("/executions", f"/executions/{body['id']}"):
        html = await api.get(page)
        assert html.status_code == 200, html.text
        assert shown in html.text, page
    for bad in ("2030-01-01T00:00:00", "tomorrow", 5):
        body_bad = {"action_ref": "core.echo", "parameters": HI, "not_before": bad}
        message = error_of(await api.post("/api/v1/executions", content=json.dumps(body_bad)), 422)
        assert "not_before" in message, message
    assert len(await api.sql("SELECT id FROM execution")) == 1


def test_cli_run_at_and_in(cli: Cli, conn: Conn) -> None:  # noqa: F811 - the fixture
    code, out, err = cli("run", "core.echo", "message=hi", "--in", "1h30m")
    assert code == 0, err
    eid = int(out.strip())
    assert 5390 < waiting(conn, eid)["left"] <= 5400
    at = (db_now(conn) + timedelta(hours=2)).replace(microsecond=0)
    code, out, err = cli("run", "core.echo", "message=hi", "--at", at.isoformat())
    assert code == 0, err
    assert waiting(conn, int(out.strip()))["not_before"] == at
    code, out, err = cli("executions", "list")
    assert code == 0, err
    assert f"requested (at {at.astimezone().strftime('%H:%M:%S')})" in out
    code, out, err = cli("executions", "get", str(eid))
    assert code == 0, err
    assert "requested (at " in out
    assert "not before " in out
    for args, says in [
        (["--in", "soon"], "not a duration"),
        (["--at", "2030-01-01T00:00:00"], "no UTC offset"),
        (["--at", "noon"], "not an ISO 8601 time"),
        (["--in", "5s", "--at", at.isoformat()], "not both"),
    ]:
        code, out, err = cli("run", "core.echo", "message=hi", *args)
        assert code == 1, (args, err)
        assert says in err, (args, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
    assert len(conn.execute("SELECT id FROM execution").fetchall()) == 2


async def test_the_executor_places_it_at_its_time_not_at_the_next_poll(
    conn: Conn, db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    add_worker(conn, "w1")
    # Polling every 5 s cannot explain a placement within 250 ms of a 1.5 s delay.
    settings = Settings(executor={"poll_interval": 5.0})
    transport = PostgresTransport(db_url, "conveyor")
    executor = ExecutorService(settings, db_url, pool, transport)
    stop, ready = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(transport.run(ready))
    await asyncio.wait_for(ready.wait(), 10)
    task = asyncio.create_task(executor.run(stop))
    try:
        # Whether its first round has run yet or not, the only round that can claim the
        # request is one the delay brings: the request's wake-up finds it not yet due, and
        # the next 5 s poll is too late.
        eid = request_execution(conn, "core.echo", HI, delay=timedelta(seconds=1.5))
        due = waiting(conn, eid)["not_before"]

        def placed() -> dict[str, Any] | None:
            row = conn.execute("SELECT status, scheduled FROM execution WHERE id = %s", (eid,)).fetchone()
            return row if row and row["scheduled"] is not None else None

        row = await until(placed, timeout=4.0, what="the delayed execution placed")
        # Database clock on both sides: not before its time, and within 250 ms of it.
        late = (row["scheduled"] - due).total_seconds()
        assert 0 <= late < 0.25, late
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
