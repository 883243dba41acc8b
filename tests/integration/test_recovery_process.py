"""A worker whose liveness lock is gone is dead at once when no session of its process
is left, and keeps its lock_grace while one is (migration 0022); the watch starts a
sweep only when a liveness session is missing. Against the real database: workers are
rows, their processes are sessions of the test whose application_name carries a tag."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from conveyor.store.db import PROCESS_TAG, tagged
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, Pool, add_worker, recovery, worker_status
from support.polling import until

EPOCH = "pg_postmaster_start_time()"  # the lock must be held in this server lifetime


def tag_worker(conn: Conn, worker: int, tag: str | None, registered: str = "now() - interval '1 second'") -> None:
    conn.execute(
        f"UPDATE worker SET session_tag = %s, registered_at = {registered} WHERE id = %s", (tag, worker)
    )  # fmt: skip


@pytest.fixture
def session_of(db_url: str) -> Iterator[dict[str, psycopg.Connection]]:  # type: ignore[type-arg]
    """Sessions standing in for a worker process's pool or liveness connection, by
    application_name (closed by the test to stand for the process dying)."""
    opened: dict[str, psycopg.Connection] = {}  # type: ignore[type-arg]
    yield opened
    for c in opened.values():
        c.close()


def open_session(db_url: str, opened: dict[str, psycopg.Connection], name: str) -> psycopg.Connection:  # type: ignore[type-arg]
    opened[name] = psycopg.connect(db_url, autocommit=True, application_name=name, options="-c search_path=conveyor")
    return opened[name]


async def test_lock_gone_and_no_session_left_is_dead_at_once_otherwise_the_grace_holds(
    conn: Conn,
    pool: Pool,
    transport: PostgresTransport,
    db_url: str,
    session_of: dict[str, psycopg.Connection],  # type: ignore[type-arg]
) -> None:
    dead = add_worker(conn, "w-dead", lock_epoch=EPOCH, lock_grace=30)
    alive = add_worker(conn, "w-alive", lock_epoch=EPOCH, lock_grace=30)
    untagged = add_worker(conn, "w-untagged", lock_epoch=EPOCH, lock_grace=30)
    # Registered after the sweep's pg_stat_activity snapshot (its sessions may not be in it).
    newer = add_worker(conn, "w-newer", lock_epoch=EPOCH, lock_grace=30)
    tag_worker(conn, dead, "aaaaaaaaaaaa")
    tag_worker(conn, alive, "bbbbbbbbbbbb")
    tag_worker(conn, untagged, None)
    tag_worker(conn, newer, "cccccccccccc", registered="now() + interval '1 hour'")
    # w-alive's liveness session dropped, its pool did not (a proxy may add to the name).
    open_session(db_url, session_of, "conveyor-worker [bbbbbbbbbbbb] - 10.0.0.7:5432")

    with conn.transaction():
        conn.execute(Q["note_lost_locks"])
        judged = conn.execute(Q["deactivate_dead_workers"]).fetchall()
        assert [(d["id"], d["lock_lost"], d["process_gone"]) for d in judged] == [(dead, True, True)]
        raise psycopg.Rollback()

    assert (await recovery(pool, transport).sweep())["dead"] == 1
    assert {w: worker_status(conn, w) for w in (dead, alive, untagged, newer)} == {
        dead: "inactive", alive: "active", untagged: "active", newer: "active"
    }  # fmt: skip
    # The others' missing locks are noted: their grace runs.
    noted = conn.execute(
        "SELECT count(*) AS n FROM worker WHERE status = 'active' AND lock_lost_at IS NOT NULL"
    ).fetchone()
    assert noted["n"] == 3

    # w-alive's process dies: its last session ends, and the next sweep judges it.
    session_of.pop("conveyor-worker [bbbbbbbbbbbb] - 10.0.0.7:5432").close()

    async def judged_dead() -> bool:
        await recovery(pool, transport).sweep()
        return worker_status(conn, alive) == "inactive"

    await until(judged_dead, timeout=10, what="w-alive judged dead once its last session ended")
    assert worker_status(conn, untagged) == "active"  # no tag: only its grace (30 s) decides
    assert worker_status(conn, newer) == "active"


async def test_the_watch_sweeps_only_when_a_liveness_session_is_missing(
    conn: Conn,
    pool: Pool,
    transport: PostgresTransport,
    db_url: str,
    session_of: dict[str, psycopg.Connection],  # type: ignore[type-arg]
) -> None:
    w = add_worker(conn, "w-watched", lock_epoch=EPOCH, lock_grace=30)
    tag_worker(conn, w, "dddddddddddd")
    liveness = open_session(db_url, session_of, "conveyor-worker-liveness [dddddddddddd]")
    assert liveness.execute("SELECT acquire_worker_lock(%s) AS ok", (w,)).fetchone()[0] is True
    open_session(db_url, session_of, "conveyor-worker [dddddddddddd]")
    watch = recovery(pool, transport)

    assert await watch.watch() == {}  # nothing missing: no sweep at all

    session_of.pop("conveyor-worker-liveness [dddddddddddd]").close()  # the lock goes with it
    swept = await until(watch.watch, timeout=10, what="the watch to sweep")
    assert swept["dead"] == 0  # the pool's session lives: the grace holds
    assert worker_status(conn, w) == "active"

    session_of.pop("conveyor-worker [dddddddddddd]").close()

    async def dead() -> bool:
        return (await watch.watch()).get("dead") == 1

    await until(dead, timeout=10, what="the watch's sweep to judge the worker dead")
    assert worker_status(conn, w) == "inactive"
    assert await watch.watch() == {}  # inactive workers are not watched


def test_every_session_of_this_process_carries_its_tag() -> None:
    assert tagged("conveyor-worker") == f"conveyor-worker [{PROCESS_TAG}]"
    long = tagged("x" * 100)
    assert len(long) == 63  # what PostgreSQL keeps of an application_name
    assert long.endswith(f" [{PROCESS_TAG}]")
