"""A worker's result writer retries a write the database could not take at least every
``database.reconnect_interval``: a result finished during a long outage is written within
about that long of the server's return (issue #25, point 5), not up to 5 s later."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus
from conveyor.worker.results import Finished, ResultWriter

FAILURES = 6  # with a doubling delay from 0.1 s, the 6th wait would be 3.2 s


class Back(Exception):
    """The fake database is back: the test ends here (not an OperationalError, so the
    writer does not retry it)."""


class OutagePool:
    """A pool whose first ``FAILURES`` connections fail as in an outage; records when each
    was asked for."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        self.asked.append(time.monotonic())
        if len(self.asked) <= FAILURES:
            raise psycopg.OperationalError("couldn't get a connection after 10.00 sec")
        raise Back
        yield  # an async generator, as the pool's own


async def test_a_write_through_an_outage_is_retried_at_least_every_reconnect_interval() -> None:
    pool = OutagePool()
    writer = ResultWriter(pool, "w", retry_max=0.5)  # type: ignore[arg-type]
    done = Finished(1, 1, AttemptEnd.COMPLETED, Decision(ExecutionStatus.COMPLETED, None, None), {}, None)
    with pytest.raises(Back):
        await writer._write([done])
    gaps = [later - earlier for earlier, later in zip(pool.asked, pool.asked[1:], strict=False)]
    assert len(gaps) == FAILURES
    # 0.5 s plus slack for a shared CPU; before, the back-off doubled to 3.2 s (and 5 s).
    assert max(gaps) < 1.2, gaps
    assert gaps[0] < 0.5, gaps  # the first retry stays quick
