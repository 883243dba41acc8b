"""A run cancelled before its task took its first step (claimed an instant before the
worker lost its standing, or before a user's cancel reached it) is still settled: released
to recovery, or recorded cancelled -- never left "running" in the worker's books while the
database says it runs on a live worker (found by the chaos suite)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from conveyor.actions.core import core
from conveyor.config import Settings
from conveyor.store.rows import ClaimedRun
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker import service
from conveyor.worker.runs import RunState


@pytest.fixture
async def worker() -> AsyncIterator[service.WorkerService]:
    settings = Settings(worker={"name": "w-early"})  # type: ignore[arg-type]
    transport = PostgresTransport("postgresql://unused", "conveyor")
    w = service.WorkerService(settings, "postgresql://unused", None, transport, list(core))  # type: ignore[arg-type]
    try:
        async with asyncio.TaskGroup() as tg:
            w._tasks = tg  # what run() sets: the group the executions' tasks belong to
            yield w
    finally:
        w._tasks = None
        w._threads.shutdown()


def _row(eid: int) -> ClaimedRun:
    return ClaimedRun(eid, 1, "core.echo", {"message": "hi"}, "python", {})


async def test_stopped_before_its_first_step_is_released(worker: service.WorkerService) -> None:
    worker._start(_row(645))  # no await in between: the task has not started
    await worker._releaser.stop_everything("lost standing")
    assert [r.execution_id for r in worker._runs.stopped()] == [645]
    assert worker._runs.active() == []  # its slot is free


async def test_cancelled_by_a_user_before_its_first_step_is_recorded_cancelled(
    worker: service.WorkerService,
) -> None:
    worker._start(_row(646))
    run = worker._runs.get(646, 1)
    assert run is not None
    run.cancel()
    assert run.state is RunState.CANCELLING
    task = run.task
    assert task is not None
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)  # the done callbacks run on the loop's next turn
    assert worker._runs.active() == []
    assert worker._runs.stopped() == []
    assert worker._results.pending == {646}
