"""The chaos pack, loaded by the suite's workers (``--import chaos.actions``).

Each run appends a row to ``public.chaos_ledger`` (created by the harness, not a product
migration) through a connection of its own: ``started`` when the run begins its work,
``ended`` when it stops (returns, raises, or is cancelled). The row names the run as the
action itself sees it (``conveyor.actions.context.current()``) plus the worker's pid, so
a run on a process the harness SIGKILLed is known to have ended at the kill.

Each row carries a token of the run's own, so a start recorded twice (the insert
committed, its answer lost with the connection, then retried) stays one row. When the
database cannot be reached to record the end (it is restarting), the end is appended to
``$CHAOS_SPILL_DIR/spill-<pid>.jsonl`` (host clock, the same clock as the server's: one
machine) and the harness merges it before the checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from conveyor import action
from conveyor.actions.context import current

# How long a run keeps trying to record its start (the database may be restarting).
START_PATIENCE = 30.0
# How long it keeps trying to record its end before spilling it to a file.
END_PATIENCE = 10.0
_INSERT = (
    "INSERT INTO public.chaos_ledger (token, execution, attempt, worker, pid, action, started) "
    "VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp()) ON CONFLICT (token) DO NOTHING"
)
_END = "UPDATE public.chaos_ledger SET ended = clock_timestamp(), outcome = %s WHERE token = %s"


def _url() -> str:
    return os.environ["DATABASE_URL"]


def _spill(token: str, outcome: str) -> None:
    """The end of a run, for the harness to merge (also for a start that may or may not
    have committed: the merge then finds no row, or closes it)."""
    folder = Path(os.environ.get("CHAOS_SPILL_DIR", "/tmp"))
    line = json.dumps({"token": token, "ended": time.time(), "outcome": outcome})
    with open(folder / f"spill-{os.getpid()}.jsonl", "a") as out:
        out.write(line + "\n")


def _row(token: str, ref: str) -> tuple[Any, ...]:
    ctx = current()
    return (token, ctx.execution_id, ctx.attempt, ctx.worker, os.getpid(), ref)


# -- sync runs (in the worker's thread pool) ------------------------------------------------


class SyncRun:
    """``with SyncRun(ref) as run:`` records the start, then the end of the block."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.conn: psycopg.Connection[Any] | None = None
        self.token = str(uuid.uuid4())

    def __enter__(self) -> SyncRun:
        row = _row(self.token, self.ref)
        deadline = time.monotonic() + START_PATIENCE
        while True:
            try:
                self.conn = psycopg.connect(_url(), autocommit=True, connect_timeout=2, application_name="chaos-ledger")
                self.conn.execute(_INSERT, row)
                return self
            except psycopg.OperationalError:
                self._close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        outcome = "ok" if kind is None else "raised"
        deadline = time.monotonic() + END_PATIENCE
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(_url(), autocommit=True, connect_timeout=2)
                self.conn.execute(_END, (outcome, self.token))
                break
            except psycopg.OperationalError:
                self._close()
                if time.monotonic() > deadline:
                    _spill(self.token, outcome)
                    break
                time.sleep(0.1)
        self._close()

    def _close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None


# -- async runs (on the worker's loop; cancelled when the worker stops them) ----------------


class AsyncRun:
    """``async with AsyncRun(ref):`` records the start, then the end of the block. The
    worker cancels the task when it stops the run (a user's cancel, or the worker losing
    its standing): the end is then recorded at once, or spilled -- whatever the run was
    doing, recording its start or its end included."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.token = str(uuid.uuid4())

    async def __aenter__(self) -> AsyncRun:
        row = _row(self.token, self.ref)
        deadline = time.monotonic() + START_PATIENCE
        try:
            while True:
                try:
                    self.conn = await psycopg.AsyncConnection.connect(
                        _url(), autocommit=True, connect_timeout=2, application_name="chaos-ledger"
                    )
                    await self.conn.execute(_INSERT, row)
                    return self
                except psycopg.OperationalError:
                    await self._close()
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            await self._stopped()  # the insert may have committed unanswered
            raise

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None and issubclass(kind, asyncio.CancelledError):
            await self._stopped()
            return
        outcome = "ok" if kind is None else "raised"
        deadline = time.monotonic() + END_PATIENCE
        try:
            while True:
                try:
                    await self._record(outcome)
                    break
                except psycopg.OperationalError:
                    await self._close()
                    if time.monotonic() > deadline:
                        _spill(self.token, outcome)
                        break
                    await asyncio.sleep(0.1)
        except asyncio.CancelledError:  # stopped while recording its end: it has ended
            await self._stopped(outcome)
            raise
        await self._close()

    async def _stopped(self, outcome: str = "cancelled") -> None:
        """The run stopped now: one quick try to record it, else spill; never hold up
        the worker's stop."""
        try:
            async with asyncio.timeout(1.0):
                await self._record(outcome)
        except (TimeoutError, psycopg.Error):
            _spill(self.token, outcome)
        await self._close()

    async def _record(self, outcome: str) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = await psycopg.AsyncConnection.connect(_url(), autocommit=True, connect_timeout=2)
        await self.conn.execute(_END, (outcome, self.token))

    async def _close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()
        self.conn = None


# -- the actions ------------------------------------------------------------------------------
# ``n`` is the harness's submission number, for tracing a run back to its request.


@action("chaos.fast")
def fast(n: int) -> dict[str, int]:
    """About 10 ms in a pool thread."""
    with SyncRun("chaos.fast"):
        time.sleep(0.01)
    return {"n": n}


@action("chaos.step")
def step(n: int, step: str) -> dict[str, Any]:
    """A workflow's task (tests/chaos/workflows.py): about 10 ms; ``step`` names the task
    (and item), so a duplicate child of one workflow shows in its parameters."""
    with SyncRun("chaos.step"):
        time.sleep(0.01)
    return {"n": n, "step": step}


@action("chaos.failing", retry={"max_attempts": 2, "backoff_base": 0.2, "backoff_max": 0.5})
def failing(n: int) -> None:
    """Always raises; retried once by the retry policy."""
    with SyncRun("chaos.failing"):
        raise RuntimeError(f"chaos.failing {n} fails, as it always does")


@action("chaos.slow")
async def slow(n: int, seconds: float) -> dict[str, int]:
    """1-3 s on the worker's loop."""
    async with AsyncRun("chaos.slow"):
        await asyncio.sleep(seconds)
    return {"n": n}


@action("chaos.fifo", policy={"concurrency": 1, "parameters": ["group"], "method": "enqueue"})
async def fifo(group: str, n: int, seconds: float) -> dict[str, int]:
    """One at a time per group, in request order."""
    async with AsyncRun("chaos.fifo"):
        await asyncio.sleep(seconds)
    return {"n": n}


@action("chaos.pair", policy={"concurrency": 2, "parameters": ["group"], "method": "enqueue"})
async def pair(group: str, n: int, seconds: float) -> dict[str, int]:
    """Two at a time per group."""
    async with AsyncRun("chaos.pair"):
        await asyncio.sleep(seconds)
    return {"n": n}


@action("chaos.gated", policy={"concurrency": 2, "method": "cancel"})
async def gated(n: int, seconds: float) -> dict[str, int]:
    """Two at a time overall; requests beyond that are refused (cancelled) at once."""
    async with AsyncRun("chaos.gated"):
        await asyncio.sleep(seconds)
    return {"n": n}


# The limits the checks hold the ledger to: ref -> (concurrency, group parameter or None, method).
POLICIES: dict[str, tuple[int, str | None, str]] = {
    "chaos.fifo": (1, "group", "enqueue"),
    "chaos.pair": (2, "group", "enqueue"),
    "chaos.gated": (2, None, "cancel"),
}
