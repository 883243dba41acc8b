"""Retention (issue #14, migration 0024): purge_executions deletes finished executions older
than an age, with what follows them, in bounded batches, and never live work; the
executors' duty applies the retention.* policy one replica at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.domain.status import TERMINAL_ORDER
from conveyor.executor.service import ExecutorService
from conveyor.ops.metrics import EXECUTIONS_PURGED
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import finished, request

Conn = psycopg.Connection[dict[str, Any]]
PURGE = "SELECT purge_executions(make_interval(days => %s), %s::text[], %s) AS n"


def set_status(conn: Conn, eid: int, status: str) -> None:
    conn.execute("SET session_replication_role = replica")
    try:
        conn.execute("UPDATE execution SET status = %s WHERE id = %s", (status, eid))
    finally:
        conn.execute("RESET session_replication_role")


def workflow_state(conn: Conn, eid: int, rerun_of: int | None = None) -> int:
    """A workflow_execution row for ``eid`` (its definition is beside the point: FKs off)."""
    conn.execute("SET session_replication_role = replica")
    try:
        return int(
            conn.execute(
                "INSERT INTO workflow_execution (execution, workflow_ref, version, rerun_of)"
                " VALUES (%s, 'x.wf', 1, %s) RETURNING id",
                (eid, rerun_of),
            ).fetchone()["id"]
        )
    finally:
        conn.execute("RESET session_replication_role")


def followers(conn: Conn, eid: int) -> None:
    """What refers to an execution and must follow it: a key, a resolved dead letter, an
    outbox row, an enforcement."""
    conn.execute("INSERT INTO execution_idempotency (key, execution) VALUES (%s, %s)", (f"k{eid}", eid))
    conn.execute(
        "INSERT INTO dead_letter (dedupe_key, transport, queue, reason, execution, resolution)"
        " VALUES (%s, 'postgres', 'q', 'expired', %s, 'stale')",
        (f"d{eid}", eid),
    )
    conn.execute(
        "INSERT INTO outbox (exchange, routing_key, message_type, payload, execution)"
        " VALUES ('executions', 'r', 't', %s, %s)",
        (Jsonb({}), eid),
    )
    conn.execute("INSERT INTO enforcement (rule_ref, outcome, execution) VALUES ('x.rule', 'requested', %s)", (eid,))


def ids(conn: Conn) -> set[int]:
    return {int(r["id"]) for r in conn.execute("SELECT id FROM execution").fetchall()}


def purge(conn: Conn, days: float = 30, statuses: list[str] | None = None, batch: int = 1000) -> int:
    return int(conn.execute(PURGE, (days, statuses, batch)).fetchone()["n"])


def test_old_finished_executions_go_with_what_follows_them(conn: Conn) -> None:
    old = [finished(conn, s) for s in TERMINAL_ORDER]
    for eid in old:
        followers(conn, eid)
    young = finished(conn, "completed", days=1)
    live = request(conn, 2)  # requested now: never finished
    old_requested = request(conn)[0]
    conn.execute("UPDATE execution SET created = now() - interval '90 days' WHERE id = %s", (old_requested,))

    assert purge(conn) == 5
    assert ids(conn) == {young, *live, old_requested}
    for table in ("execution_attempt", "execution_idempotency", "dead_letter", "outbox", "enforcement"):
        left = conn.execute(f"SELECT count(*) AS n FROM {table} WHERE execution = ANY(%s)", (old,)).fetchone()["n"]
        assert left == 0, table
    assert conn.execute("SELECT count(*) AS n FROM execution_attempt").fetchone()["n"] == 1  # the young one's
    assert purge(conn) == 0


def test_statuses_and_age_bound_what_goes(conn: Conn) -> None:
    done, failed = finished(conn, "completed", days=10), finished(conn, "failed", days=10)
    assert purge(conn, days=11) == 0
    assert purge(conn, days=9, statuses=["failed"]) == 1
    assert ids(conn) == {done}
    assert failed not in ids(conn)


def test_batches_are_bounded(conn: Conn) -> None:
    for _ in range(5):
        finished(conn)
    assert [purge(conn, batch=2) for _ in range(4)] == [2, 2, 1, 0]
    assert ids(conn) == set()


def test_a_workflow_goes_whole_and_only_when_all_of_it_has_finished(conn: Conn) -> None:
    root = finished(conn, "failed")
    workflow_state(conn, root)
    children = [finished(conn, "completed", parent=root), finished(conn, "failed", parent=root)]
    grandchild = finished(conn, "completed", parent=children[0])
    running_child = request(conn)[0]
    conn.execute("UPDATE execution SET parent = %s WHERE id = %s", (root, running_child))

    assert purge(conn) == 0  # one child still runs: the whole tree stays
    assert {root, *children, grandchild} <= ids(conn)
    set_status(conn, running_child, "completed")
    assert purge(conn) == 5
    assert ids(conn) == set()
    assert conn.execute("SELECT count(*) AS n FROM workflow_execution").fetchone()["n"] == 0


def test_a_child_never_goes_without_its_parent(conn: Conn) -> None:
    parent = request(conn)[0]  # alive
    child = finished(conn, "completed", parent=parent)
    young_parent = finished(conn, "completed", days=1)
    old_child = finished(conn, "completed", parent=young_parent)
    assert purge(conn) == 0
    assert {parent, child, young_parent, old_child} <= ids(conn)


def test_what_a_live_row_refers_to_stays(conn: Conn) -> None:
    pending = finished(conn, "failed")
    conn.execute(
        "INSERT INTO dead_letter (dedupe_key, transport, queue, reason, execution)"
        " VALUES ('pending', 'postgres', 'q', 'expired', %s)",
        (pending,),
    )
    rerun_of = finished(conn, "failed")
    old_state = workflow_state(conn, rerun_of)
    rerun = request(conn)[0]
    new_state = workflow_state(conn, rerun, rerun_of=old_state)

    assert purge(conn) == 0
    conn.execute("UPDATE dead_letter SET resolution = 'stale' WHERE execution = %s", (pending,))
    set_status(conn, rerun, "completed")  # finished just now: too young itself
    assert purge(conn) == 2
    assert ids(conn) == {rerun}
    assert conn.execute("SELECT rerun_of FROM workflow_execution WHERE id = %s", (new_state,)).fetchone() == {
        "rerun_of": None
    }


def test_a_locked_row_is_skipped_not_waited_for(conn: Conn, db_url: str) -> None:
    held, free = finished(conn), finished(conn)
    with connect_sync(db_url, "conveyor") as other:
        other.execute("SELECT 1 FROM execution WHERE id = %s FOR UPDATE", (held,))
        assert purge(conn) == 1
        other.rollback()
    assert ids(conn) == {held}
    assert free not in ids(conn)


@pytest.mark.parametrize(
    ("days", "statuses", "batch", "message"),
    [
        (30, ["running"], 10, "not running"),
        (30, ["completed", None], 10, "not NULL"),
        (-1, None, 10, "zero or more"),
        (30, None, 0, "batch must be 1 or more"),
    ],
)
def test_bad_arguments_are_refused(conn: Conn, days: float, statuses: Any, batch: int, message: str) -> None:
    finished(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        purge(conn, days, statuses, batch)
    assert len(ids(conn)) == 1


def test_purgeable_counts_top_level_executions(conn: Conn) -> None:
    root = finished(conn)
    finished(conn, parent=root)
    finished(conn, "failed")
    finished(conn, days=1)
    count = "SELECT purgeable_executions(make_interval(days => 30), %s::text[]) AS n"
    assert conn.execute(count, (None,)).fetchone()["n"] == 2
    assert conn.execute(count, (["failed"],)).fetchone()["n"] == 1


@pytest.fixture
def other_session(db_url: str) -> Iterator[Conn]:
    with connect_sync(db_url, "conveyor", autocommit=True) as c:
        yield c


async def test_the_duty_applies_the_policy_one_replica_at_a_time(
    conn: Conn, pool: AsyncConnectionPool[Any], db_url: str, other_session: Conn
) -> None:
    """Through the executor's duty (DutyLocks.run(retention.purge) under ``purge_history``),
    with executor.exclusive_duties off (the default): retention is exclusive regardless."""
    settings = Settings(retention={"completed": "7d", "failed": "off", "batch_size": 2, "max_batches": 2})
    assert not settings.executor.exclusive_duties
    done = [finished(conn, "completed", days=8) for _ in range(5)]
    kept_failed = finished(conn, "failed", days=400)
    young = finished(conn, "completed", days=6)
    executor = ExecutorService(settings, db_url, pool, PostgresTransport(db_url, "conveyor"))
    purged = EXECUTIONS_PURGED.labels("completed")
    counted = purged._value.get()
    try:
        lock = {"duty": "purge_history"}  # the name old replicas lock: a rolling upgrade stays exclusive
        other_session.execute(Q["try_duty_lock"], lock)  # another replica runs it now
        assert await executor._purge_history() is False
        assert set(done) <= ids(conn)  # nothing deleted
        assert purged._value.get() == counted
        other_session.execute(Q["duty_unlock"], lock)

        assert await executor._purge_history() is True
        assert len(set(done) & ids(conn)) == 1  # max_batches x batch_size = 4 went
        assert purged._value.get() == counted + 4
        assert await executor._purge_history() is True
        assert purged._value.get() == counted + 5
        assert ids(conn) == {kept_failed, young}
        assert not set(done) & ids(conn)
        locks = (
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        # Released after each run, while the lock connection lives on.
        assert conn.execute(locks).fetchone()["n"] == 0
    finally:
        await executor._duty_locks.close()
