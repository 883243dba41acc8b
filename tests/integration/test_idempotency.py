"""Idempotency keys in the SQL API and the SDK: a retry with the key of an earlier request
gets that request's execution, concurrent requests with one key make one execution, a key
reused for another request is refused, and keys are purged after their retention.
(Through the REST API: test_api_idempotency.py.)"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.domain.errors import ConflictError
from conveyor.domain.idempotency import InvalidIdempotencyKeyError
from conveyor.executor.service import ExecutorService
from conveyor.sdk import Client, request_execution
from conveyor.transport.postgres import PostgresTransport
from integration.builders import waiting_on_a_lock
from support.polling import eventually

Conn = psycopg.Connection[dict[str, Any]]
ONCE = "SELECT * FROM conveyor.request_execution_once('core.echo', %s, NULL, %s)"
HI = {"message": "hi"}


@pytest.fixture
def connect(db_url: str) -> Iterator[Callable[[], Conn]]:
    """Application connections (no search_path, not autocommit), closed afterwards."""
    made: list[Conn] = []

    def new() -> Conn:
        made.append(psycopg.connect(db_url, row_factory=dict_row))
        return made[-1]

    yield new
    for c in made:
        c.close()


def executions(conn: Conn, key: str | None = None) -> list[int]:
    if key is None:
        rows = conn.execute("SELECT id FROM execution ORDER BY id").fetchall()
    else:
        rows = conn.execute(
            "SELECT e.id FROM execution e JOIN execution_idempotency k ON k.execution = e.id WHERE k.key = %s", (key,)
        ).fetchall()
    return [r["id"] for r in rows]


# -- the SQL function ----------------------------------------------------------------------


def test_sql_same_key_same_execution_and_calls_without_a_key_unchanged(conn: Conn) -> None:
    plain = conn.execute("SELECT conveyor.request_execution('core.echo', '{\"message\": \"hi\"}') AS id").fetchone()
    keyed = "SELECT request_execution('core.echo', %s, idempotency_key => %s) AS id"
    first = conn.execute(keyed, (Jsonb(HI), "order-1")).fetchone()["id"]
    again = conn.execute(keyed, (Jsonb(HI), "order-1")).fetchone()["id"]
    positional = conn.execute("SELECT request_execution('core.echo', %s, NULL, 'order-1') AS id", (Jsonb(HI),))
    assert first == again == positional.fetchone()["id"]
    assert conn.execute(ONCE, (Jsonb(HI), "order-1")).fetchone() == {"execution_id": first, "repeated": True}
    other = conn.execute(keyed, (Jsonb(HI), "order-2")).fetchone()["id"]
    assert len({plain["id"], first, other}) == 3
    assert executions(conn) == sorted([plain["id"], first, other])
    # Parameters compare as JSON values, not as text.
    spaced = conn.execute("SELECT request_execution('core.echo', '{ \"message\":  \"hi\" }', NULL, 'order-1') AS id")
    assert spaced.fetchone()["id"] == first


@pytest.mark.parametrize(
    ("ref", "parameters", "parent"),
    [("core.echo", {"message": "ho"}, None), ("core.noop", {}, None), ("core.echo", HI, "first")],
)
def test_sql_a_key_reused_for_another_request_is_refused(conn: Conn, ref: str, parameters: Any, parent: Any) -> None:
    first = conn.execute("SELECT request_execution('core.echo', %s, NULL, 'k') AS id", (Jsonb(HI),)).fetchone()["id"]
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT request_execution(%s, %s, %s, 'k')", (ref, Jsonb(parameters), first if parent else None))
    assert refused.value.sqlstate == "CVA03"
    assert f"already used for another request (execution {first})" in str(refused.value)
    assert executions(conn) == [first]


@pytest.mark.parametrize("key", ["", "x" * 256])
def test_sql_refuses_an_empty_or_overlong_key(conn: Conn, key: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="1 to 255 characters"):
        conn.execute("SELECT request_execution('core.noop', '{}', NULL, %s)", (key,))
    assert executions(conn) == []


@pytest.mark.parametrize("first_commits", [True, False])
def test_sql_concurrent_same_key_waits_for_the_first(
    conn: Conn, connect: Callable[[], Conn], first_commits: bool
) -> None:
    """The second request waits on the first's uncommitted key: the first committing, it
    answers with the first's execution; the first rolling back, it makes its own."""
    a, b = connect(), connect()
    mine = a.execute(ONCE, (Jsonb(HI), "race")).fetchone()
    assert mine is not None
    assert mine["repeated"] is False
    b_pid = b.info.backend_pid
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(lambda: b.execute(ONCE, (Jsonb(HI), "race")).fetchone())
        eventually(lambda: waiting_on_a_lock(conn, b_pid), timeout=10, interval=0.02)
        assert not second.done()
        if first_commits:
            a.commit()
        else:
            a.rollback()
        theirs = second.result(timeout=10)
    b.commit()
    assert theirs is not None
    if first_commits:
        assert theirs == {"execution_id": mine["execution_id"], "repeated": True}
        assert executions(conn) == [mine["execution_id"]]
    else:
        assert theirs["repeated"] is False
        assert theirs["execution_id"] != mine["execution_id"]
        assert executions(conn) == [theirs["execution_id"]]
    assert executions(conn, "race") == executions(conn)


def test_sql_many_concurrent_requests_with_one_key_make_one_execution(conn: Conn, connect: Callable[[], Conn]) -> None:
    callers = [connect() for _ in range(8)]
    start = threading.Barrier(len(callers))

    def request(c: Conn) -> dict[str, Any]:
        start.wait(10)
        with c.transaction():
            row = c.execute(ONCE, (Jsonb(HI), "stampede")).fetchone()
        assert row is not None
        return row

    with ThreadPoolExecutor(len(callers)) as pool:
        answers = list(pool.map(request, callers))
    [eid] = executions(conn)
    assert {a["execution_id"] for a in answers} == {eid}
    assert sorted(a["repeated"] for a in answers) == [False] + [True] * (len(callers) - 1)


# -- the SDK -------------------------------------------------------------------------------


def test_sdk_same_key_same_execution_in_the_callers_transactions(conn: Conn, connect: Callable[[], Conn]) -> None:
    caller = connect()
    with caller.transaction():
        first = request_execution(caller, "core.echo", HI, idempotency_key="sdk-1")
    with caller.transaction():
        again = request_execution(caller, "core.echo", HI, idempotency_key="sdk-1")
        with pytest.raises(ConflictError, match="already used for another request"):
            request_execution(caller, "core.echo", {"message": "other"}, idempotency_key="sdk-1")
        # The refusal left the caller's transaction usable (a savepoint).
        other = request_execution(caller, "core.echo", HI, idempotency_key="sdk-2")
    assert first == again != other
    assert executions(conn) == [first, other]


def test_sdk_a_rolled_back_request_does_not_keep_its_key(conn: Conn, connect: Callable[[], Conn]) -> None:
    caller = connect()
    with caller.transaction(force_rollback=True):  # the caller's own work failed
        request_execution(caller, "core.echo", HI, idempotency_key="undone")
    assert executions(conn) == []
    with caller.transaction():
        eid = request_execution(caller, "core.echo", {"message": "now different"}, idempotency_key="undone")
    assert executions(conn, "undone") == [eid]


def test_client_request_with_a_key(db_url: str, conn: Conn) -> None:
    with Client(db_url) as client:
        first = client.request("core.echo", HI, idempotency_key="client-1")
        assert client.request("core.echo", HI, idempotency_key="client-1") == first
        assert client.request("core.echo", HI) != first  # no key: a new execution each time
        with pytest.raises(ConflictError):
            client.request("core.noop", idempotency_key="client-1")
    assert len(executions(conn)) == 2


@pytest.mark.parametrize("key", ["", " padded", "padded ", "x" * 256, "caf\u00e9", "line\nbreak", "tab\there"])
def test_sdk_refuses_an_unusable_key_before_asking_the_database(conn: Conn, key: str) -> None:
    with pytest.raises(InvalidIdempotencyKeyError, match="invalid idempotency key"):
        request_execution(conn, "core.echo", HI, idempotency_key=key)
    assert executions(conn) == []


def test_sdk_accepts_keys_up_to_255_printable_characters(conn: Conn) -> None:
    for key in ("a", "x" * 255, "550e8400-e29b-41d4-a716-446655440000", "order 42/retry:#1~"):
        assert request_execution(conn, "core.noop", idempotency_key=key) == executions(conn, key)[0]


# -- retention -----------------------------------------------------------------------------


async def test_the_executor_purges_keys_past_their_retention(
    db_url: str, conn: Conn, pool: AsyncConnectionPool[Any]
) -> None:
    old = request_execution(conn, "core.echo", HI, idempotency_key="old")
    recent = request_execution(conn, "core.echo", HI, idempotency_key="recent")
    conn.execute("UPDATE execution_idempotency SET created = now() - interval '25 hours' WHERE key = 'old'")
    conn.execute("UPDATE execution_idempotency SET created = now() - interval '23 hours' WHERE key = 'recent'")
    settings = Settings(executor={"idempotency_key_retention": 24 * 3600})
    executor = ExecutorService(settings, db_url, pool, PostgresTransport(db_url, "conveyor"))
    assert await executor._purge_keys() == 1
    assert [r["key"] for r in conn.execute("SELECT key FROM execution_idempotency").fetchall()] == ["recent"]
    assert executions(conn) == [old, recent]  # the executions themselves stay
    assert request_execution(conn, "core.echo", HI, idempotency_key="recent") == recent
    assert request_execution(conn, "core.echo", HI, idempotency_key="old") not in (old, recent)
