"""What each dashboard view shows, read with the named queries (``read.sql``, ``api.sql``,
``dead_letters.sql``, ``dashboard.sql``). Ages and rates come from the database clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from conveyor.api import search
from conveyor.api.dashboard.forms import answer_fields
from conveyor.api.dashboard.listing import Search, admission_view, admission_waiting
from conveyor.api.dashboard.web import pretty
from conveyor.api.dashboard.workflow_views import workflow_of
from conveyor.domain.dead_letters import REASONS, RESOLUTIONS
from conveyor.domain.ids import parse_id
from conveyor.domain.status import TERMINAL, ExecutionStatus
from conveyor.domain.storable import BASE64, readable
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

STATUSES = [s.value for s in ExecutionStatus]
FINISHED = {s.value for s in TERMINAL}
PAGE = 50
SHOWN = 64 * 1024  # characters of one text (output, value, parameters) an execution's page shows
_SHOWN_APART = {"stdout", "stderr", "data", "error"}


class NotFound(Exception):
    pass


def _text(params: Mapping[str, str], key: str, limit: int = 255) -> str | None:
    value = params.get(key, "").strip()
    return value[:limit] or None


def _id(params: Mapping[str, str], key: str, problems: list[str]) -> int | None:
    raw = params.get(key, "").strip()
    if not raw:
        return None
    value = parse_id(raw)
    if value is not None:
        return value
    problems.append(f"{key} must be a positive integer")
    return None


def _choice(params: Mapping[str, str], key: str, choices: Any, problems: list[str]) -> str | None:
    value = _text(params, key)
    if value is not None and value not in choices:
        problems.append(f"unknown {key} {value!r}")
        return None
    return value


@dataclass(slots=True)
class ExecutionFilters:
    status: str | None = None
    action: str | None = None
    worker: str | None = None
    before: int | None = None
    problems: list[str] = field(default_factory=list)
    search: Search = field(default_factory=Search)  # since, until, parameters, error (issue #15)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> ExecutionFilters:
        problems: list[str] = []
        status = _choice(params, "status", STATUSES, problems)
        before = _id(params, "before", problems)
        found = Search.parse(params, problems)
        return cls(status, _text(params, "action"), _text(params, "worker"), before, problems, found)

    def query(self, **changes: Any) -> str:
        values = {
            "status": self.status,
            "action": self.action,
            "worker": self.worker,
            **self.search.query(),
            "before": self.before,
        }
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v is not None})


@dataclass(slots=True)
class DeadLetterFilters:
    reason: str | None = None
    resolution: str | None = None
    problems: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> DeadLetterFilters:
        problems: list[str] = []
        reason = _choice(params, "reason", REASONS, problems)
        return cls(reason, _choice(params, "resolution", RESOLUTIONS, problems), problems)

    def query(self) -> str:
        return urlencode({k: v for k, v in (("reason", self.reason), ("resolution", self.resolution)) if v})


def _worker(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``list_workers`` row plus ``stale``: active, but no heartbeat within its own bound."""
    age, bound = row["heartbeat_age"], row["stale_after"]
    stale = row["status"] == "active" and (age is None or (bound is not None and age > bound))
    return {**row, "stale": stale}


async def workers(conn: AsyncConn) -> list[dict[str, Any]]:
    return [_worker(r) for r in await (await conn.execute(Q["list_workers"])).fetchall()]


async def overview(conn: AsyncConn) -> dict[str, Any]:
    counts = dict.fromkeys(STATUSES, 0)
    for row in await (await conn.execute(Q["counts_by_status"])).fetchall():
        counts[row["status"]] = row["n"]
    rates = await (await conn.execute(Q["dashboard_rates"])).fetchone()
    dlq = await (await conn.execute(Q["dead_letter_stats"])).fetchone()
    fleet = await workers(conn)
    tally = {
        "active": sum(w["status"] == "active" and not w["stale"] for w in fleet),
        "stale": sum(w["stale"] for w in fleet),
        "draining": sum(w["status"] == "draining" for w in fleet),
        "inactive": sum(w["status"] == "inactive" for w in fleet),
        "cordoned": sum(w["cordoned"] and w["status"] != "inactive" for w in fleet),
    }
    unfinished = sum(n for s, n in counts.items() if s not in FINISHED)
    return {
        "counts": counts,
        "unfinished": unfinished,
        "total": sum(counts.values()),
        "rates": rates,
        "dlq": dlq,
        "workers": tally,
    }


async def executions(conn: AsyncConn, filters: ExecutionFilters) -> dict[str, Any]:
    statuses = [filters.status] if filters.status else None
    found = filters.search
    params = {
        "statuses": statuses,
        "action": filters.action,
        "worker": filters.worker,
        "since": found.since,
        "until": found.until,
        "before": filters.before,
        "limit": PAGE,
        "with_result": False,
    }
    floor = await search.window(conn, filters.before, found.wanted, found.error)
    params.update(search.search_params(found.wanted, found.error, floor))
    rows = await (await conn.execute(Q["api_list_executions"], params)).fetchall()
    cursor = search.next_cursor(rows, PAGE, floor)
    older = filters.query(before=cursor) if cursor is not None else None
    return {
        "executions": rows,
        "older": older,
        "floor": floor,
        "admission": await admission_waiting(conn, rows),
        "finished_statuses": FINISHED,
    }


@dataclass(frozen=True, slots=True)
class Shown:
    """Text as the page shows it: at most ``SHOWN`` characters (a page of one execution
    stays small, and is re-rendered while it runs); ``size`` is the whole text's length."""

    text: str
    size: int

    @classmethod
    def of(cls, text: str) -> Shown:
        return cls(text[:SHOWN], len(text))

    @property
    def cut(self) -> bool:
        return self.size > len(self.text)


def _output(result: Any) -> dict[str, Any]:
    """The result, each part shown once and bounded: the error, the streams (base64 output
    decoded for reading), the returned value, and ``rest``: the result without those."""
    if not isinstance(result, dict):  # none yet (or not written by a runner)
        result = {} if result is None else {"value": result}
    view: dict[str, Any] = {"error": Shown.of(str(result["error"])) if result.get("error") else None}
    for stream in ("stdout", "stderr"):
        text, encoding = result.get(stream), result.get(f"{stream}_encoding")
        view[stream] = Shown.of(readable(text, encoding)) if isinstance(text, str) and text else None
        view[f"{stream}_binary"] = encoding == BASE64
        view[f"{stream}_truncated"] = bool(result.get(f"{stream}_truncated"))
    view["data"] = None if result.get("data") is None else Shown.of(pretty(result["data"]))
    view["data_truncated"] = bool(result.get("data_truncated"))
    rest = {k: v for k, v in result.items() if k not in _SHOWN_APART}
    view["rest"] = Shown.of(pretty(rest)) if rest else None
    return view


async def execution(conn: AsyncConn, eid: int) -> dict[str, Any]:
    row = await (await conn.execute(Q["get_execution"], {"id": eid})).fetchone()
    if row is None:
        raise NotFound(f"no execution {eid}")
    attempts = await (await conn.execute(Q["get_attempts"], {"id": eid})).fetchall()
    final = row["status"] in FINISHED and all(a["ended"] is not None for a in attempts)
    # Its children (a workflow's tasks, retries included: the first page; the API has all)
    # and, for a core.ask execution, its inquiry (where it is answered).
    children = await (await conn.execute(Q["execution_children"], {"id": eid, "after": None, "limit": PAGE})).fetchall()
    inquiry = await (await conn.execute(Q["inquiry_of_execution"], {"id": eid})).fetchone()
    # What started it (issue #13): a rule's enforcement (and its event) or a schedule's slot.
    origin = await (await conn.execute(Q["dash_execution_origin"], {"id": eid})).fetchone()
    admission = admission_view(await (await conn.execute(Q["admission_of"], {"id": eid})).fetchone())
    if origin is not None and origin["enforcement"] is None and origin["schedule"] is None:
        origin = None
    return {
        "execution": row,
        "attempts": attempts,
        "parameters": Shown.of(pretty(row["parameters"])),
        "output": _output(row["result"]),
        "final": final,
        "workflow": await workflow_of(conn, eid),
        "children": children,
        "children_more": len(children) == PAGE,
        "inquiry": inquiry,
        "origin": origin,
        "finished_statuses": FINISHED,
        "admission": admission,
    }


async def actions(conn: AsyncConn) -> list[dict[str, Any]]:
    return list(await (await conn.execute(Q["list_actions"])).fetchall())


async def dead_letters(conn: AsyncConn, filters: DeadLetterFilters) -> dict[str, Any]:
    params = {
        "reason": filters.reason,
        "resolution": filters.resolution,
        "execution": None,
        "queue": None,
        "since": None,
        "limit": PAGE,
    }
    rows = await (await conn.execute(Q["list_dead_letters"], params)).fetchall()
    stats = await (await conn.execute(Q["dead_letter_stats"])).fetchone()
    return {"dead_letters": rows, "stats": stats, "limit": PAGE}


# -- inquiries ------------------------------------------------------------------------------

INQUIRY_STATUSES = ("pending", "responded", "timeout", "cancelled")


async def inquiries(conn: AsyncConn, status: str | None) -> dict[str, Any]:
    """The newest inquiries of ``status`` (None: any)."""
    params = {"status": status, "before": None, "limit": PAGE}
    rows = await (await conn.execute(Q["list_inquiries"], params)).fetchall()
    return {"inquiries": rows, "status": status, "limit": PAGE, "statuses": INQUIRY_STATUSES}


async def inquiry(conn: AsyncConn, iid: int) -> dict[str, Any]:
    row = await (await conn.execute(Q["get_inquiry"], {"id": iid})).fetchone()
    if row is None:
        raise NotFound(f"no inquiry {iid}")
    responses = await (await conn.execute(Q["inquiry_responses"], {"id": iid})).fetchall()
    return {
        "inquiry": row,
        "responses": responses,
        "fields": answer_fields(row["schema"]),
        "schema_text": pretty(row["schema"]),
        "response_text": pretty(row["response"]),
        "final": row["status"] != "pending",
    }
