"""Actions of tests/integration/test_isolated_actions.py: at the top level of a module, so
that a child process imports them by name (``isolation="process"``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from conveyor.actions.context import current
from conveyor.actions.registry import ActionRegistry

registry = ActionRegistry()


@registry.action("iso.echo", isolation="process")
def echo(value: Any) -> dict[str, Any]:
    ctx = current()
    return {"value": value, "pid": os.getpid(), "execution_id": ctx.execution_id, "attempt": ctx.attempt}


@registry.action("iso.fail", isolation="process")
def fail(message: str) -> None:
    raise ValueError(message)


@registry.action("iso.talk", isolation="process")
def talk(lines: int) -> int:
    for i in range(lines):
        current().log(f"line {i}")
    return lines


@registry.action("iso.sleepy", isolation="process")
async def sleepy(seconds: float, pid_file: str) -> str:
    Path(pid_file).write_text(str(os.getpid()))  # noqa: ASYNC240 - a few bytes, before anything else
    await asyncio.sleep(seconds)
    return "woke"


@registry.action("iso.marks", isolation="process")
def marks(path: str, count: int) -> int:
    """Appends a wall-clock mark to ``path`` every ~5 ms, ``count`` times (its pid first)."""
    with open(path, "a", buffering=1) as f:
        f.write(f"pid {os.getpid()}\n")
        for _ in range(count):
            f.write(f"{time.time()}\n")
            time.sleep(0.005)
    return count


@registry.action("iso.nothing", isolation="process")
def nothing() -> None:
    return None


@registry.action("iso.nothing_thread")
def nothing_thread() -> None:
    return None


@registry.action("iso.spawner", isolation="process")
def spawner(pid_file: str) -> None:
    """Starts a command of its own and waits for it."""
    proc = subprocess.Popen(["sleep", "60"])
    Path(pid_file).write_text(str(proc.pid))
    proc.wait()


@registry.action("iso.fork_and_die", isolation="process")
def fork_and_die(pid_file: str) -> None:
    """Forks a process that holds the pipe to the worker open, then dies without a result."""
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    Path(pid_file).write_text(str(pid))
    os._exit(3)
