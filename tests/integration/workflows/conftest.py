"""An executor and a worker running in this test's event loop (as ``conveyor up`` runs
them), for workflows end to end: the real scheduling round, advancement and worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.actions.core import core
from conveyor.actions.registry import ActionRegistry
from conveyor.config import Settings
from conveyor.executor.service import ExecutorService
from conveyor.store.db import make_pool
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker.service import WorkerService

extra = ActionRegistry()


@extra.action("tests.fail", parameters={"type": "object"})
def fail() -> None:
    """Fail every time (retries and failure paths)."""
    raise RuntimeError("boom")


@extra.action(
    "core.local",
    parameters={
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
)
async def local(cmd: str, timeout: float = 60) -> dict[str, Any]:  # noqa: ASYNC109 (StackStorm's parameter)
    """StackStorm's core.local, in place of Conveyor's (listed after ``core``, it replaces
    it in this worker and in the action table): StackStorm's examples pass ``timeout``,
    which Conveyor's does not take (docs/workflows.md). Runs ``cmd`` in a shell; the result
    is StackStorm's {stdout, stderr, return_code, succeeded, failed}; a non-zero exit fails."""
    proc = await asyncio.create_subprocess_shell(cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    result = {"stdout": out.decode().strip(), "stderr": err.decode().strip(), "return_code": proc.returncode,
              "succeeded": proc.returncode == 0, "failed": proc.returncode != 0}  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"core.local: {cmd!r} exited {proc.returncode}: {result}")
    return result


# Conveyor's own core.local under another name (this world's core.local is StackStorm's,
# which decodes output as text): output kept exactly, flagged base64 when it is not UTF-8.
extra.subprocess_action(
    "tests.sh",
    shell=True,
    command_parameter="cmd",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    stdin="none",
)


@pytest.fixture
def workflow_settings() -> dict[str, Any]:
    """The executor's ``workflow`` settings beyond the poll interval (a module overrides it)."""
    return {}


@pytest.fixture
async def world(db_url: str, workflow_settings: dict[str, Any]) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """Services running; yields their pool (tests read and write through ``conn``)."""
    settings = Settings(  # type: ignore[arg-type]
        executor={"poll_interval": 0.2}, workflow={"poll_interval": 0.2, **workflow_settings},
        worker={"name": "w-wf", "heartbeat_interval": 1}, dead_letter={"enabled": False},
    )  # fmt: skip
    pool = make_pool(db_url, "conveyor", "test-world", 10)
    await pool.open()
    transport = PostgresTransport(db_url, "conveyor")
    async with pool.connection() as conn:
        await transport.declare_route(conn)
    executor = ExecutorService(settings, db_url, pool, transport)
    worker = WorkerService(settings, db_url, pool, transport, [*core, *extra])
    await worker.register()
    stop, fast = asyncio.Event(), asyncio.Event()
    ready = asyncio.Event()
    listener = asyncio.create_task(transport.run(ready))
    await ready.wait()
    services = [asyncio.create_task(executor.run(stop)), asyncio.create_task(worker.run(stop, fast))]
    try:
        yield pool
    finally:
        stop.set()
        fast.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*services)
        listener.cancel()
        await pool.close()
