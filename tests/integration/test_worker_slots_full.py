"""worker_slots_full (migration 0025): work prefetched on a worker whose every slot runs an
execution is left alone by the dispatch expiry, the schedule-to-start monitor and the
oldest-scheduled gauge -- all three through the one definition -- and is theirs again
once a slot frees."""

from __future__ import annotations

from conveyor.store.queries import Q
from integration.builders import Conn, add_worker, age_scheduled, claim, finish


def _dispatch(conn: Conn, worker: int) -> int:
    eid = int(conn.execute("INSERT INTO execution (action_ref) VALUES ('core.noop') RETURNING id").fetchone()["id"])
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = %s", (eid,))
    conn.execute(Q["assign"], {"ids": [eid], "workers": [worker], "executor": "t"})
    return eid


def _seen(conn: Conn) -> tuple[set[int], set[int], float]:
    expired = {r["id"] for r in conn.execute(Q["expired_dispatches"], {"ttl": 60}).fetchall()}
    with conn.transaction():
        overdue = {r["id"] for r in conn.execute(Q["overdue_scheduled"], {"default_timeout": 60}).fetchall()}
    gauges = conn.execute(Q["backlog_ages"]).fetchone()
    return expired, overdue, float(gauges["scheduled_oldest"])


def test_prefetched_behind_a_full_worker_is_left_alone_until_a_slot_frees(conn: Conn) -> None:
    worker = add_worker(conn, "w-full", capacity=1)
    running = _dispatch(conn, worker)
    [started] = claim(conn, worker)
    waiting = _dispatch(conn, worker)  # in the prefetch: the only slot is taken
    age_scheduled(conn, [waiting], 600)

    assert conn.execute("SELECT worker_slots_full(%s) AS f", (worker,)).fetchone()["f"] is True
    expired, overdue, oldest = _seen(conn)
    assert (expired, overdue) == (set(), set())
    assert oldest < 600  # not counted: it waits for a slot of a worker taking work

    assert finish(conn, worker, running, started["attempt"]) == [running]  # the slot frees
    assert conn.execute("SELECT worker_slots_full(%s) AS f", (worker,)).fetchone()["f"] is False
    expired, overdue, oldest = _seen(conn)
    assert (expired, overdue) == ({waiting}, {waiting})
    assert oldest >= 600
