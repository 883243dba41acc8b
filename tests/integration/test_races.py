"""Races between two writers, pinned down (the model test and the chaos suite found them).

Two writers interleaved by hand: the first holds its transaction open, the second runs
until it waits for the first's locks, then the first commits. Either order must leave
what running them one after the other leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.sdk import Client
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from integration.builders import request, waiting_on_a_lock
from integration.model_world import finish_params
from support.polling import eventually

Conn = psycopg.Connection[dict[str, Any]]
SCHEMA = "conveyor"


_WORKER: dict[str, Any] = {
    "name": "w", "status": "active", "runtimes": ["python"], "actions": ["core.echo"], "capabilities": Jsonb({}),
    "capacity": 5, "host": "h", "pid": 1, "version": "t", "stale_after": 30, "lock_grace": 0, "session_tag": None,
}  # fmt: skip


def _worker(conn: Conn) -> int:
    return int(conn.execute(Q["register_worker"], _WORKER).fetchone()["id"])


def _claim(conn: Conn) -> list[int]:
    rows = conn.execute(
        Q["claim_requested"], {"limit": 10, "executor": "ex", "refs": ["core.echo"], "runtimes": []}
    ).fetchall()
    return [r["id"] for r in rows]


def _one_slot_and_two_waiters(conn: Conn) -> tuple[int, int, int, int]:
    """Policy core.echo (1 at once per message); X holds the slot and runs on a worker, W
    and W2 wait in that order. Returns (worker, X, W, W2)."""
    conn.execute(Q["set_policy"], {"target": "core.echo", "concurrency": 1, "parameters": ["message"],
                                   "method": "enqueue"})  # fmt: skip
    x, w, w2 = request(conn, 3, "core.echo", {"message": "a"})
    worker = _worker(conn)
    assert _claim(conn) == [x]
    conn.execute(Q["assign"], {"ids": [x], "workers": [worker], "executor": "ex"})
    assert [r["id"] for r in conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 5}).fetchall()] == [x]
    return worker, x, w, w2


def _second_writer(db_url: str, statement: str, params: Any) -> tuple[threading.Thread, int]:
    """Run ``statement`` on a connection of its own, in a thread; returns it with its pid."""
    second = connect_sync(db_url, SCHEMA, autocommit=True)
    pid = second.info.backend_pid

    def run() -> None:
        with second:
            second.execute(statement, params)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, pid


def _waits_for_a_lock(conn: Conn, pid: int) -> bool:
    return eventually(lambda: waiting_on_a_lock(conn, pid), timeout=5, interval=0.01, message="no lock wait")


def _admission(conn: Conn) -> tuple[list[int], list[int]]:
    slots = [r["execution"] for r in conn.execute("SELECT execution FROM execution_admission_slot ORDER BY 1")]
    queue = [r["execution"] for r in conn.execute("SELECT execution FROM execution_admission_queue ORDER BY 1")]
    return slots, queue


def _first_holds_while_second_waits(
    db_url: str, conn: Conn, first_step: Callable[[Conn], None], statement: str, params: Any
) -> None:
    """``first_step`` on a connection whose transaction stays open; ``statement`` on another
    until it waits for the first's locks; then the first commits and the second finishes."""
    with connect_sync(db_url, SCHEMA) as first:
        first_step(first)
        thread, pid = _second_writer(db_url, statement, params)
        assert _waits_for_a_lock(conn, pid)
        first.commit()
    thread.join()


def _x_completed_w_cancelled_w2_admitted(conn: Conn, w2: int) -> None:
    statuses = [r["status"] for r in conn.execute("SELECT status FROM execution ORDER BY id")]
    assert statuses == ["completed", "cancelled", "requested"]
    assert _admission(conn) == ([w2], [])


def test_cancelling_the_next_waiter_while_the_slot_is_released_admits_the_one_after(db_url: str, conn: Conn) -> None:
    """The API's cancel of W (uncommitted) while X's result frees the slot: the promotion
    must admit W2. (Before migration 0007 it picked W, found it gone once the cancel
    committed, and admitted nobody: W2 waited beside a free slot for the admission repair.)"""
    worker, x, w, w2 = _one_slot_and_two_waiters(conn)

    def cancel_w(first: Conn) -> None:
        assert first.execute(Q["cancel_execution"], {"id": w, "by": "test"}).fetchone()["now"] == "cancelled"

    _first_holds_while_second_waits(db_url, conn, cancel_w, Q["finish"], finish_params(worker, x, 1))
    _x_completed_w_cancelled_w2_admitted(conn, w2)


def test_ending_a_waiter_as_it_is_admitted_releases_its_slot(db_url: str, conn: Conn) -> None:
    """X's result admits W (uncommitted) while a plain UPDATE (an operator's own SQL) ends W:
    W's slot must go and W2 be admitted. (Before migration 0007 the release found no slot
    yet, so W kept it though it ended: with a limit of 1 the group was blocked for good.)"""
    worker, x, w, w2 = _one_slot_and_two_waiters(conn)

    def finish_x(first: Conn) -> None:
        assert [r["id"] for r in first.execute(Q["finish"], finish_params(worker, x, 1)).fetchall()] == [x]

    end_w = "UPDATE execution SET status = 'cancelled', ended = now() WHERE id = %s"
    _first_holds_while_second_waits(db_url, conn, finish_x, end_w, (w,))
    _x_completed_w_cancelled_w2_admitted(conn, w2)


def test_a_cancel_that_waited_on_the_dispatch_closes_the_attempt_the_dispatch_created(db_url: str, conn: Conn) -> None:
    """The executor's dispatch of X (uncommitted: scheduled, attempt 1 opened) while a
    cancel waits for the row: once it commits, the cancel finds X scheduled and must close
    that attempt too -- run in one statement it could not see the attempt (its snapshot
    predates the dispatch) and left it open for ever (found by the chaos suite)."""
    worker = _worker(conn)
    [x] = request(conn, 1, "core.echo", {"message": "a"})
    assert _claim(conn) == [x]
    client = Client(db_url)
    answer: list[str] = []
    with connect_sync(db_url, SCHEMA) as executor:
        executor.execute(Q["assign"], {"ids": [x], "workers": [worker], "executor": "ex"})
        thread = threading.Thread(target=lambda: answer.append(client.cancel(x, by="test")))
        thread.start()
        assert _waits_for_a_lock(conn, client.conn.info.backend_pid)
        executor.commit()
    thread.join()
    client.close()
    assert answer == ["cancelled"]
    execution = conn.execute("SELECT status, attempt FROM execution WHERE id = %s", (x,)).fetchone()
    assert execution == {"status": "cancelled", "attempt": 1}
    attempts = conn.execute(
        "SELECT attempt, worker, outcome, ended IS NOT NULL AS closed FROM execution_attempt WHERE execution = %s",
        (x,),
    ).fetchall()
    assert attempts == [{"attempt": 1, "worker": worker, "outcome": "cancelled", "closed": True}]
