"""The SDK's schedule methods (part of :class:`conveyor.sdk.Client`; docs/schedules.md).
Each change is one SQL function (``create_schedule``, ``pause_schedule``,
``resume_schedule``, ``delete_schedule``, ``patch_schedule``, ``fire_schedule``, ``backfill_schedule``); the
checks around it are shared with the API (schedule_verbs.py).

    with Client(url) as client:
        client.create_schedule("nightly", cron="30 2 * * *", timezone="Europe/Paris",
                               action="ops.backup", parameters={"full": True})
        client.schedule("nightly")["next_fire_times"]
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from conveyor.store.queries import Q
from conveyor.verbs import common as verbs
from conveyor.verbs import schedules as sv


class ScheduleMethods:
    conn: psycopg.Connection[Any]

    def create_schedule(self, name: str, *, replace: bool = False, **fields: Any) -> dict[str, Any]:
        """Create a schedule (``replace=True``: create or replace). Exactly one of
        ``cron`` (5 fields, or 6 with seconds first), ``every`` (seconds, a timedelta or
        "30s"/"5m"/"1h30m") or ``at`` (one time); ``timezone`` (IANA), ``starts``,
        ``ends``, ``action`` + ``parameters`` (else it emits events on a trigger of its
        name), ``catchup`` (skip|latest|all), ``catchup_window``, ``overlap``
        (allow|skip|buffer_one|cancel_previous), ``description``. Returns the schedule
        with its next fire times."""
        params = sv.create_params(name, fields, replace=replace)
        with verbs.refusals(action_ref=fields.get("action") or ""), self.conn.transaction():
            self.conn.execute(Q["create_schedule"], params).fetchone()
        return self.schedule(name)

    def update_schedule(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change some fields of a schedule (one of cron/every/at replaces the others)."""
        row = self._schedule_row(name)
        params = sv.patch_params(name, row, changes)
        with verbs.refusals(action_ref=changes.get("action") or row["action_ref"] or ""), self.conn.transaction():
            self.conn.execute(Q["patch_schedule"], params).fetchone()
        return self.schedule(name)

    def schedules(self, *, limit: int = 500) -> list[dict[str, Any]]:
        """Every schedule (by name) with its next fire time."""
        rows = self.conn.execute(Q["list_schedules"], {"limit": limit}).fetchall()
        return [sv.view(r, count=1) for r in rows]

    def schedule(self, name: str, *, next_count: int = 5, slots: int = 20) -> dict[str, Any]:
        """One schedule: ``next_fire_times`` and its most recent ``slots`` (newest first,
        each with the execution it requested and that execution's status)."""
        row = self._schedule_row(name)
        recent = self.conn.execute(Q["schedule_slots"], {"id": row["id"], "limit": slots}).fetchall()
        return sv.view(row, next_count, recent)

    def _schedule_row(self, name: str) -> dict[str, Any]:
        row = self.conn.execute(Q["get_schedule"], {"name": name}).fetchone()
        if row is None:
            raise sv.not_found(name)
        return dict(row)

    def pause_schedule(self, name: str) -> dict[str, Any]:
        return sv.changed(name, self.conn.execute(Q["pause_schedule"], {"name": name}).fetchone())

    def resume_schedule(self, name: str) -> dict[str, Any]:
        return sv.changed(name, self.conn.execute(Q["resume_schedule"], {"name": name}).fetchone())

    def delete_schedule(self, name: str) -> None:
        row = self.conn.execute(Q["delete_schedule"], {"name": name}).fetchone()
        if not row or not row["deleted"]:
            raise sv.not_found(name)

    def fire_schedule(self, name: str) -> dict[str, Any] | None:
        """Fire now (origin manual); the slot row, or None if one was fired at this very instant."""
        with verbs.refusals():
            row = self.conn.execute(Q["fire_schedule"], {"name": name}).fetchone()
        return dict(row) if row else None

    def backfill_schedule(self, name: str, since: datetime | str, until: datetime | str) -> list[dict[str, Any]]:
        """Fire every slot of [since, until) not fired yet (origin backfill); the slots fired now."""
        with self.conn.transaction():
            slots = sv.backfill_slots(self._schedule_row(name), since, until)
            with verbs.refusals():
                rows = self.conn.execute(Q["backfill_schedule"], {"name": name, "slots": slots}).fetchall()
        return [dict(r) for r in rows]
