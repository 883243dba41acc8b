"""The transport interface: small on purpose.

Messages only wake handlers; handlers read rows and act with guarded updates, so a
lost wake-up costs at most one polling interval and a duplicate changes nothing.
Publishing happens *inside* the transaction that made the state change (a NOTIFY
on PostgreSQL, an outbox row for a broker), so a wake-up exists if and only if
the change committed.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import suppress
from enum import StrEnum
from typing import Any

import psycopg


class Topic(StrEnum):
    REQUESTED = "requested"  # executions wait to be scheduled
    CAPACITY = "capacity"  # a worker freed slots or joined
    COMPLETED = "completed"  # executions reached a terminal state (payload: ids)
    WORKER = "worker"  # work dispatched to one worker (qualified by its id)


class Doorbell:
    """Rung by the transport; ``wait`` returns early when rung, else after the timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.payloads: list[str] = []

    def ring(self, payload: str = "") -> None:
        if payload:
            self.payloads.append(payload)
        self._event.set()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the point
        rung = False
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()
                rung = True
        self._event.clear()
        return rung

    def take_payloads(self) -> list[str]:
        out, self.payloads = self.payloads, []
        return out


class Transport(ABC):
    """Publishing (inside the caller's transaction) and subscribing (doorbells)."""

    # True while subscriptions are live (readiness reports it).
    connected: bool = False

    @abstractmethod
    async def publish(
        self,
        conn: psycopg.AsyncConnection[Any],
        topic: Topic,
        *,
        worker_ids: Iterable[int] = (),
        execution_ids: Iterable[int] = (),
    ) -> None: ...

    @abstractmethod
    def subscribe(self, topic: Topic, worker_id: int | None = None, bell: Doorbell | None = None) -> Doorbell:
        """Register interest before ``run`` starts; the doorbell (a new one, or ``bell`` to
        share one between topics) rings on every message."""

    @abstractmethod
    async def run(self, ready: asyncio.Event) -> None:
        """Deliver messages to doorbells until cancelled; reconnect on failure. Sets ``ready``
        once subscriptions are live."""
