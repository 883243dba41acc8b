"""The transitions of the executor's and the worker's protocol that more than one role
makes: each named query here is executed from this module only (a verb is written once;
``tests/integration/test_verb_writers.py``), inside whatever transaction its caller holds
-- a pass of the sweep, a worker's shutdown -- so the caller decides what else commits with it.

User verbs are in ``conveyor.verbs``; these are the runtime's own, async only (the
executor and the worker are async), and several run in a pipeline or on a typed cursor,
which a verb's driver does not offer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import class_row

from conveyor.store.db import AsyncConn, Row
from conveyor.store.queries import Q
from conveyor.store.rows import ClaimedRun


async def resolve_attempts(conn: AsyncConn, decisions: Mapping[str, Any]) -> list[Row]:
    """Apply ``Decisions.params(...)``: each attempt, fenced on (execution, attempt) and its
    expected statuses, moves as decided (the sweep, the monitor, the dead-letter handler,
    a worker releasing what it interrupted). The rows that moved."""
    return await (await conn.execute(Q["resolve_attempts"], decisions)).fetchall()


async def hand_back_scheduled(conn: AsyncConn, worker: int | None) -> list[Row]:
    """``scheduled`` executions not yet started back to ``requested``: a draining worker's
    own (``worker``), or every dead worker's (None: the sweep)."""
    return await (await conn.execute(Q["hand_back_scheduled"], {"worker": worker})).fetchall()


async def set_worker_status(conn: AsyncConn, worker: int | None, status: str, reason: str | None = None) -> None:
    """A worker's own row: ``draining`` at shutdown, ``inactive`` (and why) as it leaves."""
    await conn.execute(Q["set_worker_status"], {"id": worker, "status": status, "reason": reason})


async def detach_runs(conn: AsyncConn, worker: int | None, runs: Sequence[tuple[int, int]]) -> list[Row]:
    """Leave these (execution, attempt) runs of ``worker`` to the executors' recovery (the
    lost-worker policy decides): a worker that lost its standing, or whose results the
    database forgot."""
    params = {"ids": [r[0] for r in runs], "attempts": [r[1] for r in runs], "worker": worker}
    return await (await conn.execute(Q["detach_runs"], params)).fetchall()


async def claim_scheduled(conn: AsyncConn, worker: int | None, limit: int) -> AsyncCursor[ClaimedRun]:
    """Up to ``limit`` of ``worker``'s ``scheduled`` executions -> ``running``. The cursor,
    its rows not yet fetched: in a pipeline the claim travels with the statements around it."""
    cursor = conn.cursor(row_factory=class_row(ClaimedRun))
    await cursor.execute(Q["claim_scheduled"], {"worker": worker, "limit": limit})
    return cursor
