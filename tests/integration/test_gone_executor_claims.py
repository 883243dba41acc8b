"""The claims of an executor whose liveness session is gone go back to requested at once
(release_gone_executor_claims, executor/liveness.py): killed (its session ends with it) or
frozen (the server ends the session after executor_liveness.frozen_after of silence). Not
those of an executor whose session is there, nor of an executor of an earlier version
(an id without the liveness key), which claim_timeout still bounds."""

from __future__ import annotations

import asyncio

from conveyor.config import ExecutorLivenessSettings
from conveyor.executor.liveness import ExecutorLiveness, new_liveness_key
from conveyor.store.queries import Q
from integration.builders import SCHEMA, Conn, Pool, request, rows, scheduler
from support.polling import eventually


def claimed_by(conn: Conn, executor: str, n: int = 1) -> list[int]:
    """``n`` requested executions in scheduling, claimed by ``executor`` (what a round's claim commits)."""
    ids = request(conn, n)
    conn.execute("UPDATE execution SET status = 'scheduling', executor = %s WHERE id = ANY(%s)", (executor, ids))
    return ids


def released(conn: Conn) -> list[int]:
    with conn.transaction():
        return sorted(r["id"] for r in conn.execute(Q["release_gone_executor_claims"]).fetchall())


async def test_only_claims_of_a_gone_executor_are_released(db_url: str, conn: Conn) -> None:
    alive_key, gone_key = new_liveness_key(), new_liveness_key()
    liveness = ExecutorLiveness(db_url, SCHEMA, alive_key, ExecutorLivenessSettings())
    await liveness.open()
    try:
        alive = claimed_by(conn, f"host:1:{alive_key}")
        gone = claimed_by(conn, f"host:2:{gone_key}", 2)
        older = claimed_by(conn, "host:3:0123abcd")  # an executor of an earlier version: claim_timeout's
        assert released(conn) == gone
        assert {eid: r["status"] for eid, r in rows(conn).items()} == {
            **dict.fromkeys(gone, "requested"),
            **dict.fromkeys(alive + older, "scheduling"),
        }
        assert [r["executor"] for r in rows(conn, gone).values()] == [None, None]
        assert released(conn) == []  # nothing twice
    finally:
        await liveness.close()
    assert eventually(lambda: released(conn), timeout=5) == alive  # closed: gone


async def test_a_silent_executor_loses_its_session_after_frozen_after(db_url: str, conn: Conn, pool: Pool) -> None:
    key = new_liveness_key()
    cfg = ExecutorLivenessSettings(frozen_after=0.5)
    liveness = ExecutorLiveness(db_url, SCHEMA, key, cfg)
    await liveness.open()  # and never pinged: a frozen process
    try:
        ids = claimed_by(conn, f"host:1:{key}")
        assert released(conn) == []
        loop = asyncio.get_running_loop()
        start = loop.time()
        # The Scheduler's call, as a replica runs it every check_interval.
        other = scheduler(pool, None, "host:9:aaaaaaaaaaaa")  # type: ignore[arg-type]
        while not await other.release_gone_claims():
            assert loop.time() - start < 5, "the server did not end the silent session"
            await asyncio.sleep(0.05)
        print(f"released {loop.time() - start:.2f} s after the claim, frozen_after {cfg.frozen_after:g} s")
        assert rows(conn, ids)[ids[0]]["status"] == "requested"
    finally:
        await liveness.close()


async def test_a_live_executor_reopens_its_session(db_url: str, conn: Conn) -> None:
    key = new_liveness_key()
    liveness = ExecutorLiveness(db_url, SCHEMA, key, ExecutorLivenessSettings(frozen_after=0.6))
    await liveness.open()
    stop = asyncio.Event()
    task = asyncio.create_task(liveness.run(stop))
    try:
        name = f"conveyor-executor-liveness {key} [%"
        query = "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s"
        first = conn.execute(query, (name,)).fetchone()
        assert first is not None
        await asyncio.sleep(1.5)  # pinged every 0.2 s: the server keeps it
        assert conn.execute(query, (name,)).fetchone() == first
        conn.execute("SELECT pg_terminate_backend(%s)", (first["pid"],))

        async def reopened() -> bool:
            row = conn.execute(query, (name,)).fetchone()
            return row is not None and row != first

        deadline = asyncio.get_running_loop().time() + 5
        while not await reopened():
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
        await liveness.close()
