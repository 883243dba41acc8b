"""Admission policies apply to a workflow like to any action: with a concurrency-1
``enqueue`` policy on its ref, a second workflow execution waits (requested, in the
policy's queue) until the first ends, then runs."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.domain.status import TERMINAL
from conveyor.workflows.parse import parse_workflow
from integration.builders import Conn, row
from integration.workflows.kit import children, register, request
from support.polling import until


async def test_a_concurrency_one_policy_on_a_workflow_ref_queues_the_second(
    conn: Conn, world: AsyncConnectionPool[Any]
) -> None:
    register(conn, parse_workflow("ref: tests.one_at_a_time\ntasks: {t: {action: core.sleep seconds=1.5}}"))
    conn.execute("SELECT * FROM set_admission_policy('tests.one_at_a_time', 1, '{}', 'enqueue')")
    first = request(conn, "tests.one_at_a_time")
    second = request(conn, "tests.one_at_a_time")
    await until(lambda: [c["status"] for c in children(conn, first)] == ["running"], 20, "the first's child to run")
    # The first holds the slot: the second waits in the queue, not started, no child.
    assert row(conn, second)["status"] == "requested"
    queued = conn.execute("SELECT 1 FROM execution_admission_queue WHERE execution = %s", (second,)).fetchone()
    assert queued is not None
    assert children(conn, second) == []
    await until(lambda: row(conn, second)["status"] in TERMINAL, 30, "the second to end")
    a, b = row(conn, first), row(conn, second)
    assert (a["status"], b["status"]) == ("completed", "completed")
    [first_child], [second_child] = children(conn, first), children(conn, second)
    # Never both at once: the second's child started after the first workflow ended.
    assert second_child["created"] >= a["ended"]
    assert first_child["ended"] <= a["ended"]
    assert conn.execute("SELECT count(*) AS n FROM execution_admission_queue").fetchone() == {"n": 0}
