"""Whatever an action produces reaches PostgreSQL, or ends its execution with a clear
failure, and never raises in the worker (issue #11).

Property tests feed arbitrary bytes (a command's stdout and stderr) and arbitrary Python
objects (returned values) through both runners and the worker's result writer into the
real ``finish`` write; the writer is also handed, behind the runners' back, results that
cannot be stored, in one batch with good ones that must not suffer for them."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.actions.registry import ActionDefinition
from conveyor.domain.models import ActionResult
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus
from conveyor.store.db import make_pool
from conveyor.store.queries import Q
from conveyor.worker.results import Finished, ResultWriter
from conveyor.worker.runners import run_python, run_subprocess

Conn = psycopg.Connection[dict[str, Any]]
LIMIT = 256  # small, so that cutting at the limit happens often
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

_WORKER: dict[str, Any] = {
    "name": "w", "status": "active", "runtimes": ["shell"], "actions": ["core.echo"], "capabilities": Jsonb({}),
    "capacity": 1000, "host": "h", "pid": 1, "version": "t", "stale_after": 3600, "lock_grace": 0, "session_tag": None,
}  # fmt: skip


def finished(
    eid: int, attempt: int, outcome: str, result: dict[str, Any], error: str | None, action: str | None = None
) -> Finished:
    """A result as the worker queues it: the attempt ended ``outcome``, and so does the execution."""
    end = AttemptEnd(outcome)
    return Finished(eid, attempt, end, Decision(ExecutionStatus(outcome), None, error), result, error, action)


class Harness:
    """A registered worker, its result writer on a real pool, and a way to get running
    executions on it: what the worker has when a run ends."""

    def __init__(self, runner: asyncio.Runner, conn: Conn, db_url: str) -> None:
        self.run = runner.run
        self.conn = conn
        self.worker = int(conn.execute(Q["register_worker"], _WORKER).fetchone()["id"])
        self.pool: AsyncConnectionPool[Any] = make_pool(db_url, "conveyor", "test", 2)
        self.run(self.pool.open())
        self.writer = ResultWriter(self.pool, "w")
        self.writer.worker_id = self.worker

    def running(self, n: int) -> list[tuple[int, int]]:
        ids = [int(self.conn.execute("SELECT request_execution('core.echo', %s) AS id",
                                     (Jsonb({"message": "m"}),)).fetchone()["id"]) for _ in range(n)]  # fmt: skip
        claim = {"limit": n, "executor": "ex", "refs": ["core.echo"], "runtimes": []}
        assert sorted(r["id"] for r in self.conn.execute(Q["claim_requested"], claim).fetchall()) == ids
        self.conn.execute(Q["assign"], {"ids": ids, "workers": [self.worker] * n, "executor": "ex"})
        rows = self.conn.execute(Q["claim_scheduled"], {"worker": self.worker, "limit": n}).fetchall()
        return sorted((r["id"], r["attempt"]) for r in rows)

    def write(self, finished: list[Finished]) -> list[dict[str, Any]]:
        """One batch through the writer, as the worker queues and writes it; the rows afterwards."""
        self.run(self._write(finished))
        ids = [f.execution_id for f in finished]
        rows = self.conn.execute("SELECT id, status, result FROM execution WHERE id = ANY(%s) ORDER BY id", (ids,))
        return rows.fetchall()

    async def _write(self, finished: list[Finished]) -> None:
        for f in finished:  # all queued before the writer runs: one batch
            self.writer.put(f)
        writer = asyncio.create_task(self.writer.run())
        flushed = asyncio.create_task(self.writer.flushed(within=30))  # refused data is never retried
        try:
            await asyncio.wait({writer, flushed}, return_when=asyncio.FIRST_COMPLETED)
            assert not writer.done(), f"the result writer died: {writer.exception()!r}"
            assert await flushed, "results not written"
        finally:
            writer.cancel()
            flushed.cancel()

    def postgres_refuses(self, value: Any) -> bool:
        """Whether PostgreSQL (or psycopg's JSON adaptation) refuses the value outright."""
        try:
            with self.conn.transaction():
                self.conn.execute("SELECT %s::jsonb", (Jsonb(value),))
        except (psycopg.Error, TypeError, ValueError, RecursionError):
            return True
        return False


@pytest.fixture
def harness(conn: Conn, db_url: str) -> Iterator[Harness]:
    with asyncio.Runner() as runner:
        h = Harness(runner, conn, db_url)
        try:
            yield h
        finally:
            runner.run(h.pool.close())


def as_finished(eid: int, attempt: int, result: ActionResult) -> Finished:
    """What the worker queues when a run ends (no retry: a single attempt)."""
    outcome = "completed" if result.succeeded else ("timeout" if result.timed_out else "failed")
    return finished(eid, attempt, outcome, result.to_json(), result.error, "core.echo")


def same(stored: Any, meant: Any) -> bool:
    """Equal as JSON: jsonb keeps numbers as numeric, so 1e16 comes back as an integer."""
    if isinstance(meant, float) or isinstance(stored, float):
        return isinstance(stored, int | float) and not isinstance(stored, bool) and math.isclose(stored, meant)
    if isinstance(meant, dict):
        return isinstance(stored, dict) and stored.keys() == meant.keys() and all(same(stored[k], v)
                                                                                 for k, v in meant.items())  # fmt: skip
    if isinstance(meant, list):
        return isinstance(stored, list) and len(stored) == len(meant) and all(map(same, stored, meant))
    return type(stored) is type(meant) and bool(stored == meant)


# -- returned values -------------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(
    ["\x00", "a\x00", "\ud800", "x\udfff", "\\u0000", "\\\\u0000", "\\", "é✓"]
)
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT | st.binary(max_size=4)
    | st.builds(object) | st.builds(pow, st.just(10), st.just(5000)) | st.text(max_size=2).map(lambda s: s * 300)
)  # fmt: skip
KEYS = ANY_TEXT | st.integers() | st.floats() | st.booleans() | st.none() | st.tuples(st.integers())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(KEYS, inner, max_size=4)
    | st.frozensets(st.integers(), max_size=2),
    max_leaves=12,
)  # fmt: skip


def returning(value: Any) -> ActionDefinition:
    return ActionDefinition(ref="t.v", runner_type="python", runtime="python", parameters_schema={},
                            func=lambda: value)  # fmt: skip


def test_any_returned_value_is_stored_or_fails_its_execution_clearly(harness: Harness) -> None:
    @PROPERTY
    @given(values=st.lists(VALUES, min_size=1, max_size=4))
    def check(values: list[Any]) -> None:
        runs = harness.running(len(values))
        results = [harness.run(run_python(returning(v), {}, timeout=5, output_limit=LIMIT)) for v in values]
        rows = harness.write([as_finished(e, a, r) for (e, a), r in zip(runs, results, strict=True)])
        for value, result, row in zip(values, results, rows, strict=True):
            if result.succeeded:  # stored as its JSON form, or the start of it (flagged)
                assert row["status"] == "completed", row
                meant = json.loads(json.dumps(value))
                if row["result"]["data_truncated"]:
                    assert isinstance(row["result"]["data"], str)
                    assert json.dumps(meant, ensure_ascii=False).encode().startswith(row["result"]["data"].encode())
                else:
                    assert same(row["result"]["data"], meant), (row, value)
            else:  # refused only what PostgreSQL cannot hold, and said why
                assert row["status"] == "failed", row
                assert row["result"]["error"] == result.error
                assert result.error is not None
                assert result.error.startswith("the returned value cannot be stored: ")
                assert harness.postgres_refuses(value), value

    check()


# -- command output --------------------------------------------------------------------------

JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
).flatmap(lambda v: st.sampled_from([True, False]).map(
    lambda ascii: json.dumps(v, ensure_ascii=ascii).encode("utf-8", "surrogatepass")))  # fmt: skip
OUTPUT = st.binary(max_size=400) | st.text(st.characters(exclude_categories=("Cs",)), max_size=200).map(str.encode)


def test_any_command_output_is_stored_exactly_or_fails_clearly(harness: Harness, tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"

    @PROPERTY
    @given(mode=st.sampled_from(["text", "json"]), stdout=OUTPUT | JSON_TEXT, stderr=OUTPUT)
    def check(mode: str, stdout: bytes, stderr: bytes) -> None:
        out.write_bytes(stdout)
        err.write_bytes(stderr)
        metadata = {"argv": ["/bin/sh", "-c", 'cat "$0"; cat "$1" >&2', str(out), str(err)], "shell": False,
                    "output": mode, "stdin": "none"}  # fmt: skip
        [(eid, attempt)] = harness.running(1)
        result = harness.run(run_subprocess(metadata, {}, timeout=10, kill_grace=0.5, output_limit=LIMIT))
        [row] = harness.write([as_finished(eid, attempt, result)])
        assert row["status"] == ("completed" if result.succeeded else "failed"), row
        stored = row["result"]
        for name, raw in [("stdout", stdout), ("stderr", stderr)]:
            assert stored[f"{name}_truncated"] == (len(raw) > LIMIT)
            kept = (base64.b64decode(stored[name]) if stored[f"{name}_encoding"] == "base64"
                    else stored[name].encode())  # fmt: skip
            # Exactly the bytes, or (cut at the limit) their start, less a partial last character.
            assert kept == raw if len(raw) <= LIMIT else (raw[:LIMIT].startswith(kept) and len(kept) > LIMIT - 4)
        if mode == "json" and not stored["stdout_truncated"]:
            try:
                meant = json.loads(stdout)
                storable = not harness.postgres_refuses(meant)
            except (ValueError, RecursionError):
                meant, storable = None, False
            if storable:
                assert result.succeeded, result
                assert same(stored["data"], meant), (stored["data"], meant)
            else:
                assert not result.succeeded
                assert stored["error"].startswith(("stdout is not valid JSON", "stdout is JSON that cannot be stored"))

    check()


# -- the writer's net under the runners ------------------------------------------------------------


def test_a_result_that_cannot_be_stored_fails_alone_and_spares_its_batch(harness: Harness) -> None:
    good = {"succeeded": True, "data": "fine", "duration": 0.1}
    bad = [
        {"succeeded": True, "data": "a\x00b", "duration": 0.1},
        {"succeeded": True, "stdout": "\ud800", "duration": 0.1},
        {"succeeded": True, "data": float("nan"), "duration": 0.1},
        {"succeeded": True, "data": object(), "duration": 0.1},
    ]
    results = [good, *bad, good]
    runs = harness.running(len(results))
    batch = [finished(e, a, "completed", r, None, "core.echo")
             for (e, a), r in zip(runs, results, strict=True)]  # fmt: skip
    batch.append(finished(*harness.running(1)[0], "failed", good, "error with \x00 in it"))
    rows = harness.write(batch)
    assert [r["status"] for r in rows] == ["completed", "failed", "failed", "failed", "failed", "completed", "failed"]
    assert rows[0]["result"] == good
    assert rows[5]["result"] == good
    for row in [*rows[1:5], rows[6]]:
        assert row["result"]["succeeded"] is False
        assert row["result"]["error"].startswith("the result cannot be stored: "), row
    attempts = harness.conn.execute(
        "SELECT outcome, error FROM execution_attempt WHERE execution = %s", (rows[1]["id"],)
    ).fetchall()
    assert attempts == [{"outcome": "failed", "error": rows[1]["result"]["error"]}]


def test_nested_deeper_than_json_allows_fails_the_execution_instead_of_retrying(harness: Harness) -> None:
    deep: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    [(eid, attempt)] = harness.running(1)
    [row] = harness.write([finished(eid, attempt, "completed", {"data": deep}, None)])
    assert row["status"] == "failed"
    assert row["result"]["error"].startswith("the result cannot be stored: ")
