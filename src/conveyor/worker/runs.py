"""The worker's record of each run: one per attempt, from its claim until its result is
handed to the writer or, stopped without one, it is released.

Before, a run lived in three places (a dict of running tasks, a set of runs being
cancelled, a dict of runs to release), which every path had to keep in step; here its
state is one field, and what is "active" (holds a slot) or "stopped" (waits to be
released) is read from it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class RunState(StrEnum):
    RUNNING = "running"
    CANCELLING = "cancelling"  # a user's cancel: stopping it; its result is recorded cancelled
    STOPPED = "stopped"  # stopped by this worker (shutdown, lost standing): to release


@dataclass(slots=True, eq=False)
class Run:
    execution_id: int
    attempt: int
    metadata: dict[str, Any] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    state: RunState = RunState.RUNNING

    @property
    def key(self) -> tuple[int, int]:
        return self.execution_id, self.attempt

    def cancel(self) -> None:
        """A user's cancel: stop the run once (its process group is killed by the runner)."""
        if self.state is RunState.RUNNING and self.task is not None:
            self.state = RunState.CANCELLING
            self.task.cancel()


class Runs:
    def __init__(self) -> None:
        self._runs: dict[tuple[int, int], Run] = {}

    def add(self, execution_id: int, attempt: int, metadata: dict[str, Any]) -> Run:
        run = Run(execution_id, attempt, metadata)
        self._runs[run.key] = run
        return run

    def get(self, execution_id: int, attempt: int) -> Run | None:
        """The run of this attempt while it holds a slot (not one stopped and waiting)."""
        run = self._runs.get((execution_id, attempt))
        return run if run is not None and run.state is not RunState.STOPPED else None

    def finished(self, run: Run) -> None:
        """Its task ended: forgotten, unless stopped (then kept until released)."""
        if run.state is not RunState.STOPPED:
            self._runs.pop(run.key, None)

    def released(self, runs: Iterable[Run]) -> None:
        for run in runs:
            if self._runs.get(run.key) is run:
                del self._runs[run.key]

    def active(self) -> list[Run]:
        """Runs holding a slot: running, or being cancelled."""
        return [r for r in self._runs.values() if r.state is not RunState.STOPPED]

    def stopped(self) -> list[Run]:
        return [r for r in self._runs.values() if r.state is RunState.STOPPED]

    def ids(self) -> set[int]:
        return {r.execution_id for r in self._runs.values()}


class Ran:
    """The (execution, attempt) pairs this process started, the last ``size`` of them.

    After a failover to a standby that lacked the last commits (asynchronous replication),
    the database can show an execution running on this worker whose result the worker
    wrote and forgot: that result was acknowledged by the old primary only. Told apart by
    this memory from a claim that committed unanswered (nothing ran it), it is not run
    again under the same attempt but left to recovery and its lost-worker policy."""

    def __init__(self, size: int = 20_000) -> None:
        self._size = size
        self._order: deque[tuple[int, int]] = deque()
        self._keys: set[tuple[int, int]] = set()

    def add(self, key: tuple[int, int]) -> None:
        if key in self._keys:
            return
        self._keys.add(key)
        self._order.append(key)
        if len(self._order) > self._size:
            self._keys.discard(self._order.popleft())

    def __contains__(self, key: object) -> bool:
        return key in self._keys
