"""A user's pause or resume never fails on a lock-order race with the executor (issue #25,
point 2, follow-up of the cancel's): an advancement takes a workflow's state row (FOR
UPDATE), then its execution row; pause_execution and resume_execution take them in the
same order (state row KEY SHARE, then execution, migration 0036), so the two queue instead
of deadlocking. Each race is played step by step on real connections, each step waiting
until the server shows the previous one blocked on the expected holder (pg_blocking_pids).
Before the fix each verb took the execution row first and then waited for the state row
(its event's foreign key) while the advancement waited for the execution row: PostgreSQL
aborted one side after deadlock_timeout (1 s)."""

from __future__ import annotations

import pytest

from integration.builders import Conn
from integration.workflows.test_cancel_lock_order import Call, advancing, attempt, blocked_by, end_workflow
from integration.workflows.test_cancel_tree import scalar, synthetic_tree
from support.polling import eventually

# verb -> (its statement, the workflow's status when the user asks)
VERBS = {
    "pause_execution": ("SELECT * FROM pause_execution(%s, 'tester')", "running"),
    "resume_execution": ("SELECT * FROM resume_execution(%s, 'tester')", "paused"),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("end", ["succeeded", "failed"])
def test_a_pause_or_resume_racing_the_end_of_its_workflow_waits_for_it(
    db_url: str, conn: Conn, verb: str, end: str
) -> None:
    """The advancement that ends a workflow holds its state row when the verb arrives: the
    verb waits for it, then finds the workflow ended (the API's 409), and the advancement
    ends it (paused -> running -> its end) without meeting the verb's lock."""
    query, status = VERBS[verb]
    root, _, _ = synthetic_tree(conn, 1)
    if status == "paused":  # as a user's pause left it
        conn.execute("SELECT * FROM pause_execution(%s, 'tester')", (root,))
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == status
    wid = scalar(conn, "SELECT id FROM workflow_execution WHERE execution = %s", root)
    adv = advancing(db_url, wid)
    call = Call(db_url, query, root)
    call.start()
    adv_pid = adv.info.backend_pid
    assert eventually(lambda: blocked_by(conn, call.pid, adv_pid), timeout=10, interval=0.01, message="no wait")
    failed = attempt(lambda: end_workflow(adv, wid, root, end))
    (adv.commit if failed is None else adv.rollback)()
    adv.close()
    row = call.result()
    assert failed is None, f"the advancement failed: {failed!r}"
    ended = "completed" if end == "succeeded" else "failed"
    # The verb came after the end: nothing to pause or resume (the verb answers 409).
    assert row is not None
    assert (row["was"], row["now"]) == (ended, None)
    assert scalar(conn, "SELECT status FROM execution WHERE id = %s", root) == ended
