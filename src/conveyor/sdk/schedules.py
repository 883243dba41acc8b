"""The SDK's schedule methods (part of :class:`conveyor.sdk.Client`; docs/schedules.md).
Each change is one verb of conveyor.verbs.schedules (one SQL function each:
``create_schedule``, ``patch_schedule``, ``pause_schedule``, ``resume_schedule``,
``delete_schedule``, ``fire_schedule``, ``backfill_schedule``), the body the API runs too.

    with Client(url) as client:
        client.create_schedule("nightly", cron="30 2 * * *", timezone="Europe/Paris",
                               action="ops.backup", parameters={"full": True})
        client.schedule("nightly")["next_fire_times"]
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import schedules as sv
from conveyor.verbs.drive import run


class ScheduleMethods:
    conn: Conn

    def create_schedule(self, name: str, *, replace: bool = False, **fields: Any) -> dict[str, Any]:
        """Create a schedule (``replace=True``: create or replace). Exactly one of
        ``cron`` (5 fields, or 6 with seconds first), ``every`` (seconds, a timedelta or
        "30s"/"5m"/"1h30m") or ``at`` (one time); ``timezone`` (IANA), ``starts``,
        ``ends``, ``action`` + ``parameters`` (else it emits events on a trigger of its
        name), ``catchup`` (skip|latest|all), ``catchup_window``, ``overlap``
        (allow|skip|buffer_one|cancel_previous), ``description``. Returns the schedule
        with its next fire times."""
        return run(self.conn, sv.create(name, fields, replace=replace))

    def update_schedule(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change some fields of a schedule (one of cron/every/at replaces the others)."""
        return run(self.conn, sv.patch(name, changes))

    def schedules(self, *, limit: int = 500) -> list[dict[str, Any]]:
        """Every schedule (by name) with its next fire time."""
        rows = self.conn.execute(Q["list_schedules"], {"limit": limit}).fetchall()
        return [sv.view(r, count=1) for r in rows]

    def schedule(self, name: str, *, next_count: int = 5, slots: int = 20) -> dict[str, Any]:
        """One schedule: ``next_fire_times`` and its most recent ``slots`` (newest first,
        each with the execution it requested and that execution's status)."""
        return run(self.conn, sv.read(name, next_count, slots))

    def pause_schedule(self, name: str) -> dict[str, Any]:
        return run(self.conn, sv.pause(name))

    def resume_schedule(self, name: str) -> dict[str, Any]:
        return run(self.conn, sv.resume(name))

    def delete_schedule(self, name: str) -> None:
        run(self.conn, sv.delete(name))

    def fire_schedule(self, name: str) -> dict[str, Any] | None:
        """Fire now (origin manual); the slot row, or None if one was fired at this very instant."""
        fired = run(self.conn, sv.fire(name))
        return fired[0] if fired else None

    def backfill_schedule(self, name: str, since: datetime | str, until: datetime | str) -> list[dict[str, Any]]:
        """Fire every slot of [since, until) not fired yet (origin backfill); the slots fired now."""
        return run(self.conn, sv.backfill(name, since, until))
