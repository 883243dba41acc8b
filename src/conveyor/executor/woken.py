"""The executor's woken duties, written once: the scheduling round, the workflow
advancement, the rules' enforcement and the schedules' slots are each one pass function
and its settings (:class:`WokenDuty`), and :func:`run_woken` is the loop they share.

A pass runs in its own transaction(s) and says how long to wait for its doorbell before
the next one (``None``: at once, a full batch). The failure policy is this module's alone
(:class:`DutyHealth`): a database outage is logged and retried after the poll interval
(the pass rolled back whole); a bug is counted, retried the same way, and fails the
executor's readiness once a duty keeps failing (executor.duty_failures_before_unready);
the interval duties of executor/service.py follow the same policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from conveyor.ops.metrics import DUTY_FAILING, DUTY_FAILURES
from conveyor.store.db import SESSION_ENDED, log_operational
from conveyor.transport.base import Doorbell

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WokenDuty:
    name: str  # in logs, metrics and readiness (failing_duties), and its task's name
    what: str  # what an outage's log line says failed ("workflow pass")
    bell: Doorbell  # rung by the transport when there may be work; and at stop
    poll: float  # the wait after a failure (and the reconciler's cap on an idle wait)
    # One pass; returns how long to wait for the bell before the next (None: go again at
    # once, without clearing a wake-up that came during the pass).
    run_pass: Callable[[], Awaitable[float | None]]
    # The scheduling round: a bug ends the executor (as it always has), so its claims go
    # back at once with its liveness session rather than wait, unplaced, for a retry.
    bug_is_fatal: bool = False


class DutyHealth:
    """Consecutive failures (bugs, not outages) by duty, and the readiness they decide."""

    def __init__(self, failures_before_unready: int) -> None:
        self._bound = failures_before_unready
        self._failures: dict[str, int] = {}

    def failed(self, name: str) -> None:
        """A bug, not an outage: retried at the next tick, but a duty that keeps failing
        is reported and fails readiness -- an executor that no longer recovers anything
        must not look healthy to its orchestrator. Called in an ``except`` block (the
        traceback is logged)."""
        DUTY_FAILURES.labels(name).inc()
        count = self._failures[name] = self._failures.get(name, 0) + 1
        if count >= self._bound:
            DUTY_FAILING.labels(name).set(1)
            log.exception("executor duty keeps failing; readiness fails until it succeeds", duty=name, failures=count)
        else:
            log.exception("executor duty failed; retried at the next tick", duty=name, failures=count)

    def succeeded(self, name: str) -> None:
        if self._failures.pop(name, 0) >= self._bound:
            DUTY_FAILING.labels(name).set(0)
            log.info("executor duty recovered", duty=name)

    @property
    def failing(self) -> list[str]:
        """Duties that failed ``failures_before_unready`` times in a row."""
        return sorted(name for name, count in self._failures.items() if count >= self._bound)


async def run_woken(duty: WokenDuty, stop: asyncio.Event, health: DutyHealth) -> None:
    """Run ``duty``'s passes until ``stop``: each woken by its bell or after the wait the
    previous pass asked for."""
    ringer = asyncio.create_task(ring_on(stop, duty.bell), name=f"executor-stop-{duty.name}-bell")
    try:
        while not stop.is_set():
            try:
                # Shielded: a pass commits or rolls back whole anyway; this lets one in
                # flight finish (a scheduling round that claimed rows always places them,
                # so a shutdown never leaves claims behind).
                wait = await asyncio.shield(duty.run_pass())
            except SESSION_ENDED as exc:
                log_operational(log, duty.what, exc)
                await sleep_or_stop(stop, duty.poll)
                continue
            except Exception:
                if duty.bug_is_fatal:
                    raise
                health.failed(duty.name)  # a bug must not stop the loop
                await sleep_or_stop(stop, duty.poll)
                continue
            health.succeeded(duty.name)
            if wait is not None:
                await duty.bell.wait(wait)
    finally:
        ringer.cancel()


async def ring_on(stop: asyncio.Event, bell: Doorbell) -> None:
    await stop.wait()
    bell.ring()


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; return True if stop was requested."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True
