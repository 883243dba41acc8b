"""Four verbs that are one SQL function each (issue #26, migration 0035): a schedule's
PATCH, a dead letter's replay, a token's creation and revocation, the operator's purge of
dead letters. Two PATCHes of different fields of one schedule, run at once on two real
connections, both stay applied; the interleaving is forced with a row lock held by a third
session (both PATCHes are seen waiting on it before it is released), not with timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conveyor.domain.tokens import Role, token_row
from conveyor.sdk import Client
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from integration.api_kit import Api
from integration.builders import SCHEMA, Conn, client_of

DEADLINE = 30.0  # seconds; generous: the CPU is shared


def _waiting_on_locks(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(row["n"])


def _until_waiting(conn: Conn, n: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while _waiting_on_locks(conn) < n:
        assert time.monotonic() < deadline, f"{n} sessions never waited on the schedule's row lock"
        time.sleep(0.02)


def _held(db_url: str, name: str) -> psycopg.Connection[Any]:
    """A session holding the schedule's row lock until it rolls back: both PATCHes read the
    row and reach their write before either can write."""
    blocker = connect_sync(db_url, SCHEMA, autocommit=False)
    blocker.execute("SELECT 1 FROM schedule WHERE name = %s FOR UPDATE", (name,))
    return blocker


def _race(conn: Conn, db_url: str, name: str, patches: list[Callable[[], Any]]) -> None:
    blocker = _held(db_url, name)
    try:
        with ThreadPoolExecutor(len(patches)) as pool:
            futures = [pool.submit(p) for p in patches]
            _until_waiting(conn, len(patches))
            blocker.rollback()
            for f in futures:
                f.result(timeout=DEADLINE)
    finally:
        blocker.close()


def _patcher(db_url: str, name: str, **changes: Any) -> Callable[[], Any]:
    def run() -> Any:
        with Client(db_url, SCHEMA) as c:
            return c.update_schedule(name, **changes)

    return run


def test_two_concurrent_sdk_patches_of_different_fields_both_apply(conn: Conn) -> None:
    db_url = conn.info.dsn
    with client_of(conn) as c:
        c.create_schedule("both", cron="0 * * * *", action="core.noop", description="before")
    _race(conn, db_url, "both", [_patcher(db_url, "both", cron="*/5 * * * *"),
                                 _patcher(db_url, "both", description="after")])  # fmt: skip
    row = conn.execute("SELECT kind, cron, description FROM schedule WHERE name = 'both'").fetchone()
    assert row == {"kind": "cron", "cron": "*/5 * * * *", "description": "after"}


def test_concurrent_patches_of_the_timing_and_the_zone_both_apply(conn: Conn) -> None:
    """The timing (cron/every/at) is one field: a PATCH of it and one of the zone compose."""
    db_url = conn.info.dsn
    with client_of(conn) as c:
        c.create_schedule("zoned", cron="0 * * * *", action="core.noop")
    _race(conn, db_url, "zoned", [_patcher(db_url, "zoned", every="5m"),
                                  _patcher(db_url, "zoned", timezone="Europe/Paris", overlap="skip")])  # fmt: skip
    row = conn.execute("SELECT kind, cron, every, timezone, overlap FROM schedule WHERE name = 'zoned'").fetchone()
    assert row is not None
    assert (row["kind"], row["cron"], row["every"].total_seconds()) == ("interval", None, 300)
    assert (row["timezone"], row["overlap"]) == ("Europe/Paris", "skip")


async def test_two_concurrent_api_patches_of_different_fields_both_apply(api: Api, conn: Conn) -> None:
    base = "/api/v1/schedules"
    body = {"name": "viaapi", "cron": "0 * * * *", "action": "core.noop", "description": "before"}
    assert (await api.post(base, json=body)).status_code == 201
    blocker = _held(conn.info.dsn, "viaapi")
    try:
        sends = [asyncio.create_task(api.client.patch(f"{base}/viaapi", json=j, headers=api.auth("operator")))
                 for j in ({"catchup": "all"}, {"description": "after"})]  # fmt: skip
        deadline = time.monotonic() + DEADLINE
        while _waiting_on_locks(conn) < 2:
            assert time.monotonic() < deadline, "the two PATCHes never waited on the schedule's row lock"
            await asyncio.sleep(0.02)
        blocker.rollback()
        answers = await asyncio.wait_for(asyncio.gather(*sends), DEADLINE)
    finally:
        blocker.close()
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    row = conn.execute("SELECT catchup, description FROM schedule WHERE name = 'viaapi'").fetchone()
    assert row == {"catchup": "all", "description": "after"}


def test_patch_schedule_callable_from_psql(conn: Conn) -> None:
    """The function an operator calls: only the fields named change; a missing schedule is CVN06."""
    with client_of(conn) as c:
        c.create_schedule("ops", every=60, action="core.noop", description="kept")
    conn.execute("SELECT * FROM patch_schedule('ops', ARRAY['overlap'], p_overlap => 'skip')")
    row = conn.execute("SELECT every, overlap, description FROM schedule WHERE name = 'ops'").fetchone()
    assert row is not None
    assert (row["every"].total_seconds(), row["overlap"], row["description"]) == (60, "skip", "kept")
    with pytest.raises(psycopg.DatabaseError) as raised:
        conn.execute("SELECT * FROM patch_schedule('nope', ARRAY['overlap'], p_overlap => 'skip')")
    assert raised.value.sqlstate == "CVN06"


def test_token_create_and_revoke_are_functions(conn: Conn) -> None:
    _, params = token_row("ci", Role.operator)
    made = conn.execute(Q["create_token"], params).fetchone()
    assert made is not None
    assert (made["name"], made["role"]) == ("ci", "operator")
    assert conn.execute(Q["revoke_token"], {"id": made["id"]}).fetchone() == {"id": made["id"]}
    assert conn.execute(Q["revoke_token"], {"id": made["id"]}).fetchone() is None  # revoked once
    assert conn.execute(Q["revoke_token"], {"id": 10**12}).fetchone() is None


def _letter(conn: Conn, resolution: str | None, key: str) -> int:
    row = conn.execute(
        "INSERT INTO dead_letter (dedupe_key, transport, queue, reason, payload, resolution) "
        "VALUES (%s, 'postgres', 'q', 'rejected', '{}', %s) RETURNING id",
        (key, resolution),
    ).fetchone()
    assert row is not None
    return int(row["id"])


def test_purge_dead_letters_is_a_function(conn: Conn) -> None:
    pending, failed = _letter(conn, None, "a"), _letter(conn, "failed", "b")
    params = {"reason": None, "resolution": None, "execution": None, "queue": None, "older_than": None,
              "include_pending": False}  # fmt: skip
    assert [r["id"] for r in conn.execute(Q["purge_dead_letters"], params).fetchall()] == [failed]
    params["include_pending"] = True
    assert [r["id"] for r in conn.execute(Q["purge_dead_letters"], params).fetchall()] == [pending]
    # As docs/runbook.md calls it from psql: untyped NULLs, an integer age.
    kept = _letter(conn, "failed", "d")
    assert (
        conn.execute("SELECT id FROM purge_dead_letters('rejected', NULL, NULL, NULL, 6 * 3600, false)").fetchall()
        == []
    )
    assert conn.execute("SELECT id FROM purge_dead_letters('rejected', NULL, NULL, NULL, NULL, false)").fetchall() == [
        {"id": kept}
    ]


def test_replay_dead_letter_locks_publishes_and_marks(conn: Conn) -> None:
    letter = _letter(conn, "failed", "c")
    params = {"id": letter, "by": "test", "skip_replayed": True, "routing_key": "execution.requested",
              "message_type": "execution.requested", "payload": Jsonb({"execution_ids": [1]})}  # fmt: skip
    done = conn.execute(Q["replay_dead_letter"], params).fetchone()
    assert done is not None
    assert done["outcome"] == "replayed"
    assert done["detail"] == f"published again to execution.requested on the {done['transport']} transport; was failed"
    row = conn.execute("SELECT resolution, resolved_by, detail FROM dead_letter WHERE id = %s", (letter,)).fetchone()
    assert row == {"resolution": "replayed", "resolved_by": "test", "detail": done["detail"]}
    assert conn.execute(Q["replay_dead_letter"], params).fetchone() == {"outcome": "skipped", "transport": None,
                                                                          "detail": None}  # fmt: skip
    params["id"] = 10**12
    assert (conn.execute(Q["replay_dead_letter"], params).fetchone() or {}).get("outcome") == "missing"
