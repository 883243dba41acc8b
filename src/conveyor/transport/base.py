"""The transport interface: small on purpose -- it only delivers wake-ups.

Messages only wake handlers; handlers read rows and act with guarded updates, so a
lost wake-up costs at most one polling interval and a duplicate changes nothing.
Nothing in Python publishes: the database does, in the transaction that made the state
change (triggers on ``execution`` and ``worker`` feed the SQL function ``wake()``, which
NOTIFYs or writes the outbox for the transport named in ``transport_route``), so a
wake-up exists if and only if the change committed, whoever made it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from contextlib import suppress
from typing import TYPE_CHECKING, Protocol

import structlog

from conveyor.store.db import AsyncConn
from conveyor.store.wakeups import Topic as Topic

if TYPE_CHECKING:
    from conveyor.transport.messages import DeadLetter


log = structlog.get_logger(__name__)


class Doorbell:
    """Rung by the transport; ``wait`` returns early when rung, else after the timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.payloads: list[str] = []

    def ring(self, payload: str = "") -> None:
        if payload:
            self.payloads.append(payload)
        self._event.set()

    @property
    def rung(self) -> bool:
        """Rung since the last ``wait``: the next ``wait`` returns at once."""
        return self._event.is_set()

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


class DeadLetterSink(Protocol):
    """Where a transport hands the dead letters it receives (the executor's handler)."""

    async def handle(self, dead_letter: DeadLetter) -> str:
        """Record and resolve; return the resolution. Raises psycopg.OperationalError
        when the database is unreachable (the message is kept and handled again once it
        answers)."""

    async def record_unresolved(self, dead_letter: DeadLetter) -> None:
        """Record a dead letter that could not be resolved (poison), left pending."""


class Transport(ABC):
    """Publishing (inside the caller's transaction) and subscribing (doorbells)."""

    kind: str
    _connected: bool = False

    @property
    def connected(self) -> bool:
        """True while subscriptions are live (readiness reports it)."""
        return self._connected

    def handle_dead_letters(self, sink: DeadLetterSink) -> None:  # noqa: B027 - optional hook
        """Consume the dead-letter queue into ``sink`` (a broker transport). The
        PostgreSQL transport has no queue: the executor finds expired dispatches itself."""

    async def reconcile(self) -> dict[str, int]:
        """Publish again what waits past a bound with no message pending (a broker
        transport; on PostgreSQL the consumers' polling is the reconciler)."""
        return {}

    async def dlq_depth(self) -> int | None:
        """Messages waiting in the broker's dead-letter queue, if there is one."""
        return None

    async def declare_route(self, conn: AsyncConn) -> None:
        """Make the database publish wake-ups for this transport (``transport_route``);
        executors and workers call it at start."""
        row = await (await conn.execute("SELECT was FROM set_transport_route(%s)", (self.kind,))).fetchone()
        if row is None:
            return  # already this transport
        was = row["was"] if isinstance(row, dict) else row[0]
        if was is None:
            log.info("wake-ups go through this transport", transport=self.kind)
        else:  # another process of this installation may still use the old one: a misconfiguration
            log.warning(
                "wake-ups switched to this transport; every process of the installation must use it",
                transport=self.kind,
                was=was,
            )

    @abstractmethod
    def subscribe(self, topic: Topic, worker_id: int | None = None, bell: Doorbell | None = None) -> Doorbell:
        """Register interest before ``run`` starts; the doorbell (a new one, or ``bell`` to
        share one between topics) rings on every message."""

    @abstractmethod
    async def run(self, ready: asyncio.Event) -> None:
        """Deliver messages to doorbells until cancelled; reconnect on failure. Sets ``ready``
        once services may start: the database's subscriptions are live (a broker may still be
        connecting; ``connected`` says when everything is)."""
