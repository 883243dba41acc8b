"""The execution verbs, each one body: driven by the sync driver (the SDK's, the CLI's) and
by the async one (the API's) against the real database, they give the same answers -- the
result, or the same refusal -- and a refusal leaves nothing behind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    ExecutionNotFoundError,
    InvalidParametersError,
    NotFoundError,
    UnknownActionError,
)
from conveyor.domain.retention import RetentionError
from conveyor.sdk.callers import in_schema
from conveyor.store.db import AsyncConn, Conn, connect
from conveyor.verbs import executions
from conveyor.verbs.drive import Verb, run, run_async
from integration.builders import finished
from integration.workflows.test_cancel_tree import scalar, synthetic_tree

SCHEMA = "conveyor"


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[AsyncConn]:
    """An API-like connection: the schema on its search path, not autocommit."""
    c = await connect(db_url, SCHEMA)
    try:
        yield c
    finally:
        await c.close()


async def both(conn: Conn, aconn: AsyncConn, verb: Callable[[], Verb[Any]]) -> tuple[Any, Any]:
    """The verb's answer (or refusal) from the sync driver, then from the async one."""
    answers: list[Any] = []
    for drive in ("sync", "async"):
        try:
            if drive == "sync":
                answers.append(run(conn, verb()))
            else:
                answers.append(await run_async(aconn, verb()))
                await aconn.commit()
        except ConveyorError as exc:
            await aconn.rollback()
            answers.append((type(exc), str(exc)))
    return answers[0], answers[1]


def count(conn: Conn, where: str = "true") -> int:
    return int(scalar(conn, f"SELECT count(*) FROM execution WHERE {where}"))


async def test_a_request_is_the_same_from_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    sync, asyn = await both(conn, aconn, lambda: executions.request("core.echo", {"message": "hi"}, by="tester"))
    assert sync[1] is asyn[1] is False
    assert asyn[0] == sync[0] + 1
    rows = conn.execute("SELECT action_ref, parameters, requested_by FROM execution ORDER BY id").fetchall()
    assert rows == [{"action_ref": "core.echo", "parameters": {"message": "hi"}, "requested_by": "tester"}] * 2


async def test_an_idempotent_repeat_is_the_first_execution(conn: Conn, aconn: AsyncConn) -> None:
    first = run(conn, executions.request("core.noop", key="k-1"))
    assert await both(conn, aconn, lambda: executions.request("core.noop", key="k-1")) == (
        (first[0], True),
        (first[0], True),
    )
    refused = await both(conn, aconn, lambda: executions.request("core.echo", {"message": "x"}, key="k-1"))
    assert refused[0] == refused[1]
    assert refused[0][0] is ConflictError
    assert count(conn) == 1


@pytest.mark.parametrize(
    ("ref", "parameters", "error"),
    [("nope.gone", {}, UnknownActionError), ("core.sleep", {"seconds": "x"}, InvalidParametersError)],
)
async def test_a_refused_request_is_the_same_refusal(
    conn: Conn, aconn: AsyncConn, ref: str, parameters: dict[str, Any], error: type[ConveyorError]
) -> None:
    sync, asyn = await both(conn, aconn, lambda: executions.request(ref, parameters))
    assert sync == asyn
    assert sync[0] is error
    assert count(conn) == 0


async def test_a_delayed_request_waits(conn: Conn, aconn: AsyncConn) -> None:
    await both(conn, aconn, lambda: executions.request("core.noop", delay=timedelta(hours=1)))
    assert count(conn, "not_before > now() + interval '50 minutes'") == 2


async def test_a_batch_is_the_same_from_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    batch = [("core.echo", {"message": "a"}), ("core.noop", {}), ("core.echo", {"message": "b"})]
    sync, asyn = await both(conn, aconn, lambda: executions.request_batch(batch))
    assert len(sync) == len(asyn) == 3
    assert sync == sorted(sync)
    assert asyn == [i + 3 for i in sync]
    assert await both(conn, aconn, lambda: executions.request_batch([])) == ([], [])
    refused = await both(conn, aconn, lambda: executions.request_batch([("core.noop", {}), ("nope.x", {})]))
    assert refused[0] == refused[1] == (UnknownActionError, str(UnknownActionError("nope.x")))
    assert count(conn) == 6


async def test_a_request_on_a_connection_without_the_schema(db_url: str, aconn: AsyncConn) -> None:
    """In a caller's transaction (sdk.callers.in_schema): the verb finds Conveyor's schema
    whatever the caller's search_path, and leaves that path as it was, after an answer and
    after a refusal."""
    with psycopg.connect(db_url, autocommit=True, row_factory=psycopg.rows.dict_row) as bare:
        before = scalar(bare, "SHOW search_path")
        with bare.transaction():
            eid, _ = run(bare, in_schema(SCHEMA, executions.request("core.noop")))
            ids = run(bare, in_schema(SCHEMA, executions.request_batch([("core.noop", {})] * 2)))
            assert scalar(bare, "SHOW search_path") == before
            with pytest.raises(UnknownActionError):
                run(bare, in_schema(SCHEMA, executions.request("nope.x")))
            assert scalar(bare, "SHOW search_path") == before
        assert ids == [eid + 1, eid + 2]
        assert scalar(bare, "SELECT count(*) FROM conveyor.execution") == 3


async def test_pause_and_resume_from_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    roots = [synthetic_tree(conn, 1)[0] for _ in range(2)]
    pick = iter(roots)
    assert await both(conn, aconn, lambda: executions.pause(next(pick), "tester")) == ("paused", "paused")
    plain, _ = run(conn, executions.request("core.noop"))
    refused = await both(conn, aconn, lambda: executions.pause(plain, "tester"))
    assert refused[0] == refused[1]
    assert refused[0] == (ConflictError, f"execution {plain} is requested: only a running workflow execution can pause")
    pick = iter(roots)
    assert await both(conn, aconn, lambda: executions.resume(next(pick), "tester")) == ("running", "running")
    missing = await both(conn, aconn, lambda: executions.resume(10**12, "tester"))
    assert missing[0] == missing[1] == (ExecutionNotFoundError, str(ExecutionNotFoundError(10**12)))


async def test_cancel_from_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    eids = [run(conn, executions.request("core.noop"))[0] for _ in range(2)]
    pick = iter(eids)
    assert await both(conn, aconn, lambda: executions.cancel(next(pick), "tester")) == ("cancelled", "cancelled")
    again = await both(conn, aconn, lambda: executions.cancel(eids[0], "tester"))
    assert again[0] == again[1]
    assert again[0][0] is ConflictError


async def test_rerun_from_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    original, _ = run(conn, executions.request("core.echo", {"message": "again"}))
    sync, asyn = await both(
        conn, aconn, lambda: executions.rerun(original, from_failed=False, by="tester", requested_by="tester")
    )
    assert asyn == sync + 1
    rows = conn.execute("SELECT action_ref, parameters, requested_by FROM execution WHERE id > %s", (original,))
    assert (
        rows.fetchall()
        == [{"action_ref": "core.echo", "parameters": {"message": "again"}, "requested_by": "tester"}] * 2
    )
    # From its failed tasks: only a workflow execution, only one that ended badly.
    not_a_workflow = await both(conn, aconn, lambda: executions.rerun(original, from_failed=True, by="tester"))
    assert not_a_workflow[0] == not_a_workflow[1]
    assert not_a_workflow[0][0] is NotFoundError
    running = synthetic_tree(conn, 1)[0]
    refused = await both(conn, aconn, lambda: executions.rerun(running, from_failed=True, by="tester"))
    assert refused[0] == refused[1]
    assert refused[0][0] is ConflictError


async def test_purge_from_both_drivers(conn: Conn, aconn: AsyncConn) -> None:
    for _ in range(3):
        finished(conn)
    # Two a batch: the sync driver's batch, then the async one's, then nothing left.
    assert await both(conn, aconn, lambda: executions.purge(30 * 86400, ["completed"], 2)) == (2, 1)
    assert await both(conn, aconn, lambda: executions.purge(30 * 86400)) == (0, 0)
    refused = await both(conn, aconn, lambda: executions.purge(30 * 86400, ["running"]))
    assert refused[0] == refused[1]
    assert refused[0][0] is RetentionError
