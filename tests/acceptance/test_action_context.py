"""The execution context an action sees (``conveyor.actions.context.current()``): set by
the worker around each run, visible to async actions and, through the runner's copy of
the context, to sync ones in their pool thread; each concurrent run sees its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, eventually
from conveyor.actions.context import ExecutionContext, current, running
from conveyor.actions.registry import ActionRegistry
from conveyor.sdk import request_execution

Conn = psycopg.Connection[dict[str, Any]]


def test_current_outside_a_run_is_an_error() -> None:
    with pytest.raises(LookupError, match="not inside a Conveyor action run"):
        current()
    ctx = ExecutionContext(7, 2, "w1")
    with running(ctx):
        assert current() == ctx
    with pytest.raises(LookupError):
        current()


async def test_runner_passes_the_context_to_sync_and_async_actions() -> None:
    from conveyor.worker.runners import run_python

    registry = ActionRegistry()
    threads: list[str] = []

    @registry.action("t.sync")
    def sync_action(delay: float) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        threading.Event().wait(delay)  # both runs overlap in their threads
        ctx = current()
        return {"execution_id": ctx.execution_id, "attempt": ctx.attempt, "worker": ctx.worker}

    @registry.action("t.async")
    async def async_action(delay: float) -> dict[str, Any]:
        await asyncio.sleep(delay)
        ctx = current()
        return {"execution_id": ctx.execution_id, "attempt": ctx.attempt, "worker": ctx.worker}

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="t-action")

    async def run(ref: str, ctx: ExecutionContext) -> Any:
        definition = registry.get(ref)
        assert definition is not None
        with running(ctx):
            result = await run_python(definition, {"delay": 0.1}, timeout=5, executor=pool)
        assert result.succeeded, result
        return result.data

    try:
        contexts = [ExecutionContext(i, i % 3 + 1, f"w{i}") for i in range(1, 5)]
        refs = ["t.sync", "t.async", "t.sync", "t.async"]
        results = await asyncio.gather(*(asyncio.create_task(run(r, c)) for r, c in zip(refs, contexts, strict=True)))
    finally:
        pool.shutdown(wait=True)
    assert results == [{"execution_id": c.execution_id, "attempt": c.attempt, "worker": c.worker} for c in contexts]
    assert len(threads) == 2
    assert all(name.startswith("t-action") for name in threads)
    with pytest.raises(LookupError):
        current()  # nothing leaked into the caller


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


@pytest.mark.acceptance
def test_worker_sets_the_context_of_each_run(procs: Procs, env: dict[str, str], db: Conn, tmp_path: Path) -> None:
    (tmp_path / "ctxmod.py").write_text(
        "import asyncio\n\nfrom conveyor import action\nfrom conveyor.actions.context import current\n\n\n"
        "@action('ctx.sync', retry={'max_attempts': 2, 'backoff_base': 0})\n"
        "def sync_ctx(fail_first: bool) -> dict:\n"
        "    ctx = current()\n"
        "    if fail_first and ctx.attempt == 1:\n"
        "        raise RuntimeError('first attempt fails')\n"
        "    return {'execution_id': ctx.execution_id, 'attempt': ctx.attempt, 'worker': ctx.worker}\n\n\n"
        "@action('ctx.async')\n"
        "async def async_ctx() -> dict:\n"
        "    await asyncio.sleep(0)\n"
        "    ctx = current()\n"
        "    return {'execution_id': ctx.execution_id, 'attempt': ctx.attempt, 'worker': ctx.worker}\n"
    )
    env = {**env, "PYTHONPATH": str(tmp_path)}
    procs.start("executor", name="executor", env=env).wait_for_log("executor started")
    procs.start("worker", "--name", "ctx-w", "--import", "ctxmod", name="worker", env=env).wait_for_log(
        "worker registered"
    )
    ids = [
        request_execution(db, "ctx.sync", {"fail_first": False}),
        request_execution(db, "ctx.sync", {"fail_first": True}),
        request_execution(db, "ctx.async", {}),
    ]

    def done() -> list[dict[str, Any]] | None:
        rows = db.execute("SELECT id, status, attempt, result FROM execution WHERE id = ANY(%s) ORDER BY id", (ids,))
        found = rows.fetchall()
        return found if all(r["status"] == "completed" for r in found) else None

    rows = eventually(done, timeout=30, interval=0.1, message=procs.logs)
    assert [(r["id"], r["attempt"]) for r in rows] == [(ids[0], 1), (ids[1], 2), (ids[2], 1)]
    for r in rows:
        assert r["result"]["data"] == {"execution_id": r["id"], "attempt": r["attempt"], "worker": "ctx-w"}, r
