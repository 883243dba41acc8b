"""The executions list's searches (issue #15): a time range (created since / until, in
UTC), parameters containing a JSON object or ``key=value`` pairs, and text in the error;
and the admission badge of each execution the list shows that waits for a slot."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from conveyor.api import search
from conveyor.domain.errors import ConveyorError
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

RETRY_LIMIT = 100  # "retry failed" reruns at most this many at once
SCAN = search.SCAN


def _time(params: Mapping[str, str], key: str, problems: list[str]) -> tuple[str | None, datetime | None]:
    """A time as typed (a ``datetime-local`` input: ``2024-05-01T12:00``) and as read: UTC
    unless it names its own offset."""
    text = params.get(key, "").strip()[:64]
    if not text:
        return None, None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        problems.append(f"{key} must be a date and time such as 2024-05-01T12:00 (UTC)")
        return None, None
    return text, value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Search:
    since_text: str | None = None
    since: datetime | None = None
    until_text: str | None = None
    until: datetime | None = None
    parameters: str | None = None  # as typed
    wanted: dict[str, Any] | None = None  # as the query takes it
    error: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str], problems: list[str]) -> Search:
        since_text, since = _time(params, "since", problems)
        until_text, until = _time(params, "until", problems)
        text = params.get("parameters", "").strip() or None
        wanted = error = None
        try:
            wanted = search.parse_parameters(text)
        except ConveyorError as exc:  # shown; the list is not filtered by it
            problems.append(str(exc))
        try:
            error = search.error_term(params.get("error"))
        except ConveyorError as exc:
            problems.append(str(exc))
        return cls(since_text, since, until_text, until, text, wanted, error)

    def query(self) -> dict[str, str | None]:
        return {"since": self.since_text, "until": self.until_text, "parameters": self.parameters, "error": self.error}

    @property
    def active(self) -> bool:
        return self.wanted is not None or self.error is not None


def api_query(filters: Any) -> dict[str, str]:
    """The API list's query for the failed executions matching the list's filters: what
    "retry failed" reruns (the newest ``RETRY_LIMIT``)."""
    found: Search = filters.search
    values = {
        "status": "failed",
        "action": filters.action,
        "worker": filters.worker,
        "since": found.since.isoformat() if found.since else None,
        "until": found.until.isoformat() if found.until else None,
        "parameters": found.parameters if found.wanted is not None else None,
        "error": found.error,
        "limit": str(RETRY_LIMIT),
    }
    return {k: v for k, v in values.items() if v is not None}


async def admission_waiting(conn: AsyncConn, rows: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Execution id -> why it waits (policy, group, limit, ahead), for the rows shown that
    are ``requested`` (only those can wait for a slot)."""
    ids = [r["id"] for r in rows if r["status"] == "requested"]
    if not ids:
        return {}
    found = await (await conn.execute(Q["dash_admission_waiting"], {"ids": ids})).fetchall()
    return {int(r["execution"]): _with_group(r) for r in found}


def admission_view(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An admission row (``admission_of``, ``dash_admission_waiting``) plus ``group``: its
    group key as JSON text (empty for a policy without grouping), for the badge."""
    return None if row is None else _with_group(row)


def _with_group(row: Mapping[str, Any]) -> dict[str, Any]:
    key = row["group_key"]
    return {**row, "group": json.dumps(key, ensure_ascii=False, sort_keys=True) if key else ""}
