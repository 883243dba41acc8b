"""Searching executions by their parameters and by the text of their error (issue #15),
for the API's list and the dashboard's.

Neither search has an index (no GIN on ``parameters``; the error is a key of the
``result``), so each one is bounded by an id window: the ``SCAN`` ids below the cursor
(or the newest ones). ``api_list_executions`` filters that window with a backward range
scan of the primary key, so a search costs at most ``SCAN`` rows on a 10-million-row
table, matches or not; the next page's cursor is the window's floor when the window held
fewer than a page of matches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain.documents import load_json
from conveyor.domain.errors import ConveyorError
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

SCAN = 20_000  # ids a search examines per page
MAX_TERM = 1000  # characters of a search term


def parse_parameters(text: str | None) -> dict[str, Any] | None:
    """A parameters search: a JSON object (``{"host": "a"}``), or ``key=value`` pairs
    separated by commas or spaces, each value read as JSON if it is JSON (``n=5``,
    ``ok=true``) and as a string otherwise (``ref=main``). None for an empty text."""
    text = (text or "").strip()
    if not text:
        return None
    if len(text) > MAX_TERM:
        raise ConveyorError(f"the parameters search is over {MAX_TERM} characters")
    if text.startswith("{"):
        try:
            value = load_json(text)
        except ValueError as exc:
            raise ConveyorError(f"the parameters search is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConveyorError("the parameters search must be a JSON object")
        return value
    found: dict[str, Any] = {}
    for pair in text.replace(",", " ").split():
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConveyorError(f"the parameters search needs key=value pairs or a JSON object, not {pair!r}")
        try:
            found[key] = load_json(raw)
        except ValueError:  # NaN, 1e400 and plain words are searched as text
            found[key] = raw
    return found


def error_term(text: str | None) -> str | None:
    text = (text or "").strip()
    if len(text) > MAX_TERM:
        raise ConveyorError(f"the error search is over {MAX_TERM} characters")
    return text or None


async def window(conn: AsyncConn, before: int | None, parameters: Any, error: str | None) -> int | None:
    """The floor of the id window a search examines (None: no search, no window)."""
    if parameters is None and error is None:
        return None
    if before is None:
        row = await (await conn.execute(Q["execution_top_id"])).fetchone()
        assert row is not None  # an aggregate: one row, always
        before = int(row["top"])
    return max(before - SCAN, 1)


def search_params(parameters: Any, error: str | None, floor: int | None) -> dict[str, Any]:
    """The search's part of ``api_list_executions``' parameters."""
    return {"parameters": None if parameters is None else Jsonb(parameters), "error": error, "floor": floor}


def next_cursor(rows: Sequence[Mapping[str, Any]], limit: int, floor: int | None) -> int | None:
    """Where the next page starts: after the last row of a full page; for a search, at the
    floor of a window that held less than a page (the older ids are still to search)."""
    if len(rows) == limit:
        return int(rows[-1]["id"])
    if floor is not None and floor > 1:
        return floor
    return None
