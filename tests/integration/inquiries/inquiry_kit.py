"""Inquiries as the services leave them, for the integration tests: a core.ask request
(with its requester), claimed as the scheduler claims it, and asked (ask_inquiries); an
answer through respond_inquiry; rows read back."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.store.queries import Q

Conn = psycopg.Connection[dict[str, Any]]
EXECUTOR = "ex-test"


def request_ask(conn: Conn, parameters: dict[str, Any], *, by: str | None = None, parent: int | None = None) -> int:
    """A core.ask execution (requested), requested by ``by``."""
    with conn.transaction():
        if by is not None:
            conn.execute(Q["set_requested_by"], {"by": by})
        row = conn.execute("SELECT request_execution('core.ask', %s, %s) AS id", (Jsonb(parameters), parent)).fetchone()
    assert row is not None
    return int(row["id"])


def claim(conn: Conn, eid: int, executor: str = EXECUTOR) -> None:
    """requested -> scheduling by ``executor``, as claim_executor_run leaves it."""
    conn.execute("UPDATE execution SET status = 'scheduling', executor = %s WHERE id = %s", (executor, eid))


def ask_once(conn: Conn, eid: int, executor: str = EXECUTOR) -> list[dict[str, Any]]:
    return list(conn.execute(Q["ask_inquiries"], {"ids": [eid], "executor": executor}).fetchall())


def ask(conn: Conn, parameters: dict[str, Any], *, by: str | None = None, parent: int | None = None) -> tuple[int, int]:
    """Requested, claimed and asked: (execution id, inquiry id)."""
    eid = request_ask(conn, parameters, by=by, parent=parent)
    claim(conn, eid)
    rows = ask_once(conn, eid)
    assert [(r["execution"], r["created"]) for r in rows] == [(eid, True)], rows
    return eid, int(rows[0]["inquiry"])


def respond(conn: Conn, iid: int, responder: str, data: Any = None, role: str = "operator") -> dict[str, Any]:
    params = {"id": iid, "responder": responder, "role": role, "data": Jsonb(data if data is not None else {})}
    row = conn.execute(Q["respond_inquiry"], params).fetchone()
    assert row is not None
    return dict(row)


def inquiry(conn: Conn, iid: int) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM inquiry WHERE id = %s", (iid,)).fetchone()
    assert row is not None
    return dict(row)


def execution(conn: Conn, eid: int) -> dict[str, Any]:
    row = conn.execute("SELECT id, status, result, requested_by, ended FROM execution WHERE id = %s", (eid,)).fetchone()
    assert row is not None
    return dict(row)


def audit(conn: Conn, iid: int) -> list[tuple[str, str | None, Any]]:
    rows = conn.execute(Q["inquiry_responses"], {"id": iid}).fetchall()
    return [(r["responder"], r["role"], r["data"]) for r in rows]


def past_deadline(conn: Conn, iid: int) -> None:
    """Move the deadline into the past (database clock), as time passing would."""
    conn.execute("UPDATE inquiry SET deadline = now() - interval '1 second' WHERE id = %s", (iid,))
