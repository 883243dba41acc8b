"""A user's cancel never fails on a lock-order race with the executor (issue #25, point 2,
follow-up). An advancement takes a workflow's state row (FOR UPDATE), then its execution
row; a cancel takes them in the same order (state row KEY SHARE, then execution), so the
two queue instead of deadlocking. Each race is played step by step on real connections:
each step waits until the server shows the previous one blocked on the expected holder
(pg_blocking_pids), never on timing. Before the fix, each ended in PostgreSQL's deadlock
detection aborting one side after deadlock_timeout (1 s)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from integration.builders import Conn
from integration.workflows.test_cancel_tree import scalar, synthetic_tree
from support.polling import eventually

CANCELS = {
    "cancel_execution": "SELECT * FROM cancel_execution(%s, 'tester')",
    "cancel_workflow": "SELECT * FROM cancel_workflow(%s, 'tester', 'cancel_running')",
}


def blocked_by(conn: Conn, waiter: int, holder: int) -> bool:
    """Whether session ``waiter`` waits for a lock that session ``holder`` holds."""
    return bool(scalar(conn, "SELECT %s = ANY(pg_blocking_pids(%s))", holder, waiter))


class Call(threading.Thread):
    """One statement on its own autocommit connection, in a thread: its row or its error."""

    def __init__(self, db_url: str, query: str, *args: Any) -> None:
        super().__init__(daemon=True)
        self.conn = connect_sync(db_url, "conveyor", autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.query, self.args = query, args
        self.row: dict[str, Any] | None = None
        self.error: psycopg.Error | None = None

    def run(self) -> None:
        try:
            self.row = self.conn.execute(self.query, self.args).fetchone()
        except psycopg.Error as exc:
            self.error = exc

    def result(self) -> dict[str, Any] | None:
        self.join(30)
        assert not self.is_alive()
        self.conn.close()
        assert self.error is None, f"the verb failed: {self.error!r}"
        return self.row


def attempt(step: Callable[[], object]) -> psycopg.Error | None:
    try:
        step()
    except psycopg.Error as exc:
        return exc
    return None


def advancing(db_url: str, wid: int) -> psycopg.Connection[Any]:
    """An advancement of workflow ``wid`` in flight: its advisory lock and state row held."""
    adv = connect_sync(db_url, "conveyor")
    adv.execute("SET lock_timeout = '20s'")  # a bug must not hang the test
    adv.execute(Q["workflow_try_lock"], {"ids": [wid]})
    assert adv.execute(Q["workflow_lock"], {"ids": [wid]}).fetchall()
    return adv


def end_workflow(adv: psycopg.Connection[Any], wid: int, execution: int, status: str) -> None:
    """The rest of the advancement that ends it, in the advancer's order (Advancer._apply)."""
    adv.execute(Q["workflow_update"], {
        "ids": [wid], "statuses": [status], "contexts": [Jsonb({})], "outputs": [Jsonb(None)],
        "errors": [Jsonb([])], "cancel_policies": ["allow_finish"],
    })  # fmt: skip
    adv.execute(Q["workflow_resume_execution"], {"executions": [execution]})
    adv.execute(Q["workflow_end_execution"], {
        "executions": [execution], "statuses": ["completed" if status == "succeeded" else status],
        "results": [Jsonb(None)],
    })  # fmt: skip


@pytest.mark.parametrize("verb", sorted(CANCELS))
def test_a_cancel_racing_the_end_of_its_workflow_waits_for_it(db_url: str, conn: Conn, verb: str) -> None:
    """The advancement that ends a workflow holds its state row when the cancel arrives:
    the cancel waits for it (before: it locked the execution row first, then waited for the
    state row, while the advancement waited for the execution row -- a deadlock)."""
    root, _, _ = synthetic_tree(conn, 1)
    wid = scalar(conn, "SELECT id FROM workflow_execution WHERE execution = %s", root)
    adv = advancing(db_url, wid)
    cancel = Call(db_url, CANCELS[verb], root)
    cancel.start()
    adv_pid = adv.info.backend_pid
    assert eventually(lambda: blocked_by(conn, cancel.pid, adv_pid), timeout=10, interval=0.01, message="no wait")
    failed = attempt(lambda: end_workflow(adv, wid, root, "succeeded"))
    (adv.commit if failed is None else adv.rollback)()
    adv.close()
    row = cancel.result()
    assert failed is None, f"the advancement failed: {failed!r}"
    # The cancel came after the end: nothing to cancel (the verb answers 409).
    assert row is not None
    assert (row["was"], row["now"]) == ("completed", None)
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == "completed"


def test_a_sub_workflow_failing_at_its_start_while_its_root_is_cancelled(db_url: str, conn: Conn) -> None:
    """A sub-workflow starts while the tree walk waits (for another advancement), and its
    first advancement fails it at once while the walk goes on: the walk locks the new
    sub-workflow's state row before it moves its execution, so it waits for that
    advancement instead of holding the execution row it needs (before: a deadlock)."""
    root, _, _ = synthetic_tree(conn, 2)
    first = scalar(conn, "SELECT min(w.id) FROM workflow_execution w JOIN execution e ON e.id = w.execution"
                         " WHERE e.parent = %s", root)  # fmt: skip
    sub = scalar(conn, "INSERT INTO execution (action_ref, parent) VALUES ('tests.tree', %s) RETURNING id", root)
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 'ex-test' WHERE id = %s", (sub,))

    other = advancing(db_url, first)  # an advancement of another sub-workflow: the walk waits for it
    cancel = Call(db_url, CANCELS["cancel_workflow"], root)
    cancel.start()
    assert eventually(lambda: blocked_by(conn, cancel.pid, other.info.backend_pid), timeout=10, interval=0.01,
                      message="the walk does not wait")  # fmt: skip
    # Meanwhile the sub-workflow starts (a scheduling round) and its first advancement begins.
    assert conn.execute("SELECT * FROM start_workflows(%s, 'ex-test', 20)", ([sub],)).fetchall()
    wid = scalar(conn, "SELECT id FROM workflow_execution WHERE execution = %s", sub)
    adv = advancing(db_url, wid)
    other.rollback()
    other.close()
    adv_pid = adv.info.backend_pid
    assert eventually(lambda: blocked_by(conn, cancel.pid, adv_pid), timeout=10, interval=0.01,
                      message="the walk does not wait for the sub-workflow's advancement")  # fmt: skip
    # The advancement fails the sub-workflow at once (e.g. its input is invalid).
    failed = attempt(lambda: end_workflow(adv, wid, sub, "failed"))
    (adv.commit if failed is None else adv.rollback)()
    adv.close()
    cancel.result()
    assert failed is None, f"the advancement failed: {failed!r}"
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", sub) == "failed"
    live = "SELECT count(*) FROM execution WHERE status NOT IN ('canceling', 'cancelled', 'failed')"
    assert scalar(conn, live) == 0
