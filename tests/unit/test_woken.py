"""The loop of the executor's woken duties (executor/woken.py): one failure policy for the
scheduling round, the workflow advancement, the rules and the schedules' slots."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from conveyor.executor.woken import DutyHealth, WokenDuty, run_woken
from conveyor.transport.base import Doorbell
from support.polling import until


def _duty(run_pass: Callable[[], float | None], bell: Doorbell, *, bug_is_fatal: bool = False) -> WokenDuty:
    async def one_pass() -> float | None:
        return run_pass()

    return WokenDuty(
        name="test-duty", what="test pass", bell=bell, poll=0.001, run_pass=one_pass, bug_is_fatal=bug_is_fatal
    )


async def _until(condition: Callable[[], bool]) -> None:
    await until(condition, timeout=10, what="the passes", interval=0.005)


async def test_a_full_batch_goes_again_at_once_and_an_idle_pass_waits_for_the_bell() -> None:
    stop, bell, health = asyncio.Event(), Doorbell(), DutyHealth(3)
    waits: list[float | None] = [None, None, 60.0]
    calls = 0

    def run_pass() -> float | None:
        nonlocal calls
        calls += 1
        return waits.pop(0) if waits else 60.0

    task = asyncio.create_task(run_woken(_duty(run_pass, bell), stop, health))
    await _until(lambda: calls >= 3)
    await asyncio.sleep(0.1)
    assert calls == 3  # two full batches, then the wait for the bell (60 s)
    bell.ring()
    await _until(lambda: calls >= 4)
    stop.set()  # rings the bell: the loop ends without waiting out its 60 s
    await asyncio.wait_for(task, 5)


async def test_bugs_and_outages_are_retried_and_a_duty_that_keeps_failing_is_reported() -> None:
    stop, bell, health = asyncio.Event(), Doorbell(), DutyHealth(3)
    bug = KeyError("a bug")
    outcomes: list[BaseException | None] = [psycopg.OperationalError("down"), bug, bug, bug, None]
    seen: list[list[str]] = []

    def run_pass() -> float | None:
        seen.append(health.failing)
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        return 60.0

    task = asyncio.create_task(run_woken(_duty(run_pass, bell), stop, health))
    await _until(lambda: len(seen) == 5)
    # An outage is not a failure; the third bug in a row reports the duty, a success clears it.
    assert seen == [[], [], [], [], ["test-duty"]]
    assert health.failing == []
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_a_bug_in_the_scheduling_round_ends_the_loop() -> None:
    def run_pass() -> float | None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await asyncio.wait_for(
            run_woken(_duty(run_pass, Doorbell(), bug_is_fatal=True), asyncio.Event(), DutyHealth(3)), 5
        )
