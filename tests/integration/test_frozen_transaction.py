"""A worker frozen inside a transaction (a paused VM, SIGSTOP between two statements) holds
its locks: live output's share lock on its execution, say. The executors' sweep skips locked
rows, so the execution would wait for the server to end that session -- 60 s -- long past
the threshold at which it is to run elsewhere. A worker's sessions carry its
self_fence_after as idle_in_transaction_session_timeout (app.serve, store/db.py): the lock
is gone before the sweep looks."""

from __future__ import annotations

import psycopg
import pytest

from conveyor.config import WorkerSettings
from conveyor.store.db import connect_sync, conninfo_kwargs
from conveyor.store.queries import Q
from integration.builders import Conn, add_worker
from integration.test_finish_cost import running
from support.polling import eventually

SCHEMA = "conveyor"


def test_a_session_frozen_in_a_transaction_lets_go_within_the_workers_bound(db_url: str, conn: Conn) -> None:
    cfg = WorkerSettings(heartbeat_interval=0.5)  # staleness 1.5 s; self-fence after 1 s
    worker = add_worker(conn, "w")
    ((eid, _),) = running(conn, worker, 1)
    frozen = psycopg.connect(db_url, **conninfo_kwargs(SCHEMA, "frozen-worker", idle_timeout=cfg.self_fence_after))
    try:
        assert frozen.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("1s",)
        # What append_output does, then nothing more: the process is stopped.
        frozen.execute("SELECT id FROM execution WHERE id = %s FOR SHARE", (eid,))
        conn.execute("UPDATE worker SET status = 'inactive' WHERE id = %s", (worker,))  # the executors' verdict

        def swept() -> list[int]:
            with connect_sync(db_url, SCHEMA, "sweep") as sweep, sweep.transaction():
                return [r["id"] for r in sweep.execute(Q["lost_running"]).fetchall()]

        assert swept() == []  # locked: skipped
        assert eventually(swept, timeout=cfg.staleness + 5, interval=0.1) == [eid]
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            frozen.execute("SELECT 1")  # thawed: its session is gone, and its writes with it
    finally:
        frozen.close()


def test_other_processes_keep_the_long_bound() -> None:
    assert "idle_in_transaction_session_timeout=60000ms" in conninfo_kwargs(SCHEMA, "executor")["options"]
