"""Python actions isolated in a child process (runners/isolated.py, runners/child.py): the
result, the error with its traceback, ctx.log() lines, and the child killed on cancel and on
timeout, and stopping itself when its lease runs out (a frozen worker) -- real processes,
real signals."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.actions.context import ExecutionContext, running
from conveyor.domain.models import ActionResult
from conveyor.worker.runners import run_python
from conveyor.worker.runners.isolated import Lease, run_isolated
from integration.isolated_actions import registry


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


async def _until(predicate: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture
async def lease() -> AsyncIterator[Lease]:
    """A lease renewed every 50 ms, as a healthy worker's heartbeats would."""
    held = Lease(2.0)

    async def renew() -> None:
        while True:
            held.renew(time.monotonic())
            await asyncio.sleep(0.05)

    task = asyncio.create_task(renew())
    try:
        yield held
    finally:
        task.cancel()


async def _run(ref: str, parameters: dict[str, Any], lease: Lease, logs: list[tuple[str, bytes]] | None = None,
               limit: float = 20.0, kill_grace: float = 1.0) -> ActionResult:  # fmt: skip
    definition = registry.get(ref)
    assert definition is not None
    out = None if logs is None else (lambda stream, data: logs.append((stream, data)))
    with running(ExecutionContext(41, 3, "w-iso", output=out)):
        return await run_isolated(definition, parameters, timeout=limit, kill_grace=kill_grace, lease=lease)


async def test_result_comes_back_from_the_child(lease: Lease) -> None:
    result = await _run("iso.echo", {"value": {"a": [1, "two"]}}, lease)
    assert result.succeeded, result
    assert result.data["value"] == {"a": [1, "two"]}
    assert (result.data["execution_id"], result.data["attempt"]) == (41, 3)
    assert result.data["pid"] != os.getpid()


async def test_error_and_traceback_come_back(lease: Lease) -> None:
    result = await _run("iso.fail", {"message": "no such order"}, lease)
    assert not result.succeeded
    assert result.exit_code == 1
    assert "no such order" in (result.error or "")
    assert "Traceback" in result.stderr, result.stderr
    assert "ValueError: no such order" in result.stderr
    assert "isolated_actions.py" in result.stderr


async def test_ctx_log_lines_reach_the_worker_in_order(lease: Lease) -> None:
    logs: list[tuple[str, bytes]] = []
    result = await _run("iso.talk", {"lines": 50}, lease, logs)
    assert result.succeeded
    assert result.data == 50
    assert logs == [("log", f"line {i}\n".encode()) for i in range(50)]


async def test_cancel_kills_the_child(lease: Lease, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    task = asyncio.create_task(_run("iso.sleepy", {"seconds": 60, "pid_file": str(pid_file)}, lease))
    await _until(lambda: pid_file.exists() and pid_file.read_text())
    pid = int(pid_file.read_text())
    assert not _gone(pid)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert _gone(pid), "the child outlived its cancelled run"


async def test_cancel_while_the_child_starts_kills_it(lease: Lease, tmp_path: Path) -> None:
    task = asyncio.create_task(_run("iso.sleepy", {"seconds": 60, "pid_file": str(tmp_path / "pid")}, lease))
    await asyncio.sleep(0)  # the run is now waiting for the thread that starts its child
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    # A child left running would have written its pid by now (about 10-50 ms after its start).
    await asyncio.sleep(1.0)
    pid_file = tmp_path / "pid"
    assert not pid_file.exists() or _gone(int(pid_file.read_text())), "the child outlived its cancelled start"
    assert [p for p in multiprocessing.active_children() if p.name == "conveyor-action"] == []


async def test_timeout_kills_the_child(lease: Lease, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    result = await _run("iso.sleepy", {"seconds": 60, "pid_file": str(pid_file)}, lease, limit=1.0)
    assert result.timed_out, result
    assert result.error == "timed out after 1s"
    assert time.monotonic() - started < 5
    assert _gone(int(pid_file.read_text()))


async def test_timeout_kills_what_the_action_started(lease: Lease, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    result = await _run("iso.spawner", {"pid_file": str(pid_file)}, lease, limit=1.0, kill_grace=0.5)
    assert result.timed_out, result
    await _until(lambda: _gone(int(pid_file.read_text())))


async def test_a_child_that_dies_is_told_apart_from_what_it_forked(lease: Lease, tmp_path: Path) -> None:
    """The child exits without a result while a process it forked holds the pipe: the run ends
    at once with the exit code, and the forked process is killed with the child's group."""
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    result = await _run("iso.fork_and_die", {"pid_file": str(pid_file)}, lease)
    assert result.error == "the action's process exited with code 3 before returning", result
    assert time.monotonic() - started < 5
    await _until(lambda: _gone(int(pid_file.read_text())))


async def test_child_stops_itself_when_its_lease_expires(tmp_path: Path) -> None:
    """Nobody renews the lease (the worker is frozen or hung): the child exits on its own."""
    started = time.monotonic()
    result = await _run("iso.sleepy", {"seconds": 60, "pid_file": str(tmp_path / "pid")}, Lease(1.0))
    assert not result.succeeded
    assert "lease expired" in (result.error or ""), result
    assert time.monotonic() - started < 5  # 1 s of lease, then 2 s for the worker to stop the run itself


async def test_a_thawed_child_past_its_lease_writes_nothing(lease: Lease, tmp_path: Path) -> None:
    """SIGSTOP the child beyond its lease (as a frozen host would be), SIGCONT it: it dies
    before writing one more mark."""
    path = tmp_path / "marks"
    task = asyncio.create_task(_run("iso.marks", {"path": str(path), "count": 100000}, lease))
    await _until(lambda: path.exists() and len(path.read_text().splitlines()) > 20)
    pid = int(path.read_text().splitlines()[0].split()[1])
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    lease.span = 0.3  # the renewal stops with the "worker" frozen
    lease.deadline.value = time.monotonic() + 0.3
    renewal = lease.renew
    lease.renew = lambda last_ok: None  # type: ignore[method-assign]
    try:
        await asyncio.sleep(0.6)
        thawed_at = time.time()
        os.kill(pid, signal.SIGCONT)
        result = await asyncio.wait_for(task, 5)
    finally:
        lease.renew = renewal  # type: ignore[method-assign]
    assert "lease expired" in (result.error or ""), result
    last = float(path.read_text().splitlines()[-1])
    assert last < frozen_at + 0.05, f"a mark {last - thawed_at:+.3f}s after the thaw"
    assert _gone(pid)


async def test_overhead_of_a_child_per_run(lease: Lease) -> None:
    """Measured, not asserted tightly: the cost of a child per execution (forkserver)."""
    await _run("iso.nothing", {}, lease)  # the fork server starts once
    isolated, threaded = [], []
    for _ in range(20):
        t = time.perf_counter()
        assert (await _run("iso.nothing", {}, lease)).succeeded
        isolated.append(time.perf_counter() - t)
        definition = registry.get("iso.nothing_thread")
        assert definition is not None
        t = time.perf_counter()
        assert (await run_python(definition, {}, timeout=5)).succeeded
        threaded.append(time.perf_counter() - t)
    iso_ms, thr_ms = statistics.median(isolated) * 1000, statistics.median(threaded) * 1000
    print(f"per-execution: process {iso_ms:.1f} ms (median of 20), thread {thr_ms:.2f} ms")
    assert iso_ms < 1000
