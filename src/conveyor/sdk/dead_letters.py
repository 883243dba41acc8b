"""The SDK's dead-letter methods (part of :class:`conveyor.sdk.Client`): the messages the
executors' handler recorded in ``dead_letter`` (docs/runbook.md), read, published again
to where they were going, and purged. Replaying and purging are the verbs of
``conveyor.verbs.dead_letters``, as the API runs them.

    with Client(url) as client:
        for letter in client.dead_letters(resolution="pending"):
            print(client.replay_dead_letter(letter["id"]))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from conveyor.domain.errors import NotFoundError
from conveyor.domain.ids import is_id
from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import dead_letters as dv
from conveyor.verbs.dead_letters import Outcome, PurgeFilters
from conveyor.verbs.drive import run


class DeadLetterMethods:
    conn: Conn

    def dead_letters(
        self,
        *,
        reason: str | None = None,
        resolution: str | None = None,
        execution: int | None = None,
        queue: str | None = None,
        since: float | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Newest first, with every filter optional: ``resolution`` ``pending`` for the
        ones not resolved yet, ``since``: first seen within this many seconds."""
        params = {
            "reason": reason,
            "resolution": resolution,
            "execution": execution,
            "queue": queue,
            "since": since,
            "limit": limit,
        }
        return list(self.conn.execute(Q["list_dead_letters"], params).fetchall())

    def dead_letter(self, dead_letter_id: int) -> dict[str, Any]:
        """One dead letter: every column, with the message body (payload) and headers."""
        row = (
            self.conn.execute(Q["get_dead_letter"], {"id": dead_letter_id}).fetchone()
            if is_id(dead_letter_id)
            else None
        )
        if row is None:
            raise NotFoundError(f"no dead letter with id {dead_letter_id}")
        return row

    def dead_letter_ids(
        self,
        *,
        reason: str | None = None,
        resolution: str | None = None,
        execution: int | None = None,
        queue: str | None = None,
        since: float | None = None,
        include_replayed: bool = False,
        limit: int = 1000,
    ) -> list[int]:
        """The ids a replay by filters takes, oldest first (replayed in their original
        order); letters replayed already only with ``include_replayed``."""
        params = {
            "reason": reason,
            "resolution": resolution,
            "execution": execution,
            "queue": queue,
            "since": since,
            "include_replayed": include_replayed,
            "limit": limit,
        }
        return [r["id"] for r in self.conn.execute(Q["select_dead_letters"], params).fetchall()]

    def replay_dead_letter(self, dead_letter_id: int, *, by: str = "sdk", skip_replayed: bool = False) -> Outcome:
        """Publish the letter again to where it was going (checked with the consumers' rules
        first) and mark it replayed by ``by``. The outcome says what happened: ``error``
        (none such; it cannot be replayed as it is), ``skipped`` (with ``skip_replayed``:
        replayed meanwhile), else its ``routing_key``."""
        return run(self.conn, dv.replay(dead_letter_id, by=by, skip_replayed=skip_replayed))

    def replay_dead_letters(
        self,
        ids: Iterable[int],
        *,
        by: str = "sdk",
        skip_replayed: bool = False,
        report: Callable[[Outcome], None] | None = None,
    ) -> list[Outcome]:
        """:meth:`replay_dead_letter` for each id, each in its own transaction: what was
        replayed before an error stays replayed. ``report`` sees each outcome as it comes."""
        outcomes = []
        for dead_letter_id in ids:
            outcome = self.replay_dead_letter(dead_letter_id, by=by, skip_replayed=skip_replayed)
            if report is not None:
                report(outcome)
            outcomes.append(outcome)
        return outcomes

    def purgeable_dead_letters(self, filters: PurgeFilters) -> int:
        """How many records :meth:`purge_dead_letters` would delete."""
        row = self.conn.execute(Q["count_purgeable_dead_letters"], filters.params()).fetchone()
        return int(row["count"]) if row else 0

    def purge_dead_letters(self, filters: PurgeFilters) -> int:
        """Delete the records ``filters`` match (resolved ones only unless it says
        ``include_pending``; no filter: every one); returns how many were deleted."""
        return run(self.conn, dv.purge(filters))
