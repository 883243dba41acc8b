"""Facts the code states once, on both sides of the database (issue #26): the Python
definition and the SQL one are compared here, so neither can change alone."""

from __future__ import annotations

import re

from conveyor.domain.placement import free_capacity
from conveyor.domain.status import ON_WORKER, TERMINAL, TERMINAL_ORDER
from conveyor.domain.status import ExecutionStatus as S
from conveyor.store.db import channel, connect_sync, listen_statement
from conveyor.store.queries import Q
from conveyor.store.rows import LiveWorker
from conveyor.store.wakeups import WAKES, Topic
from integration.builders import Conn, add_worker


def test_the_terminal_statuses_are_the_same_in_sql(conn: Conn) -> None:
    row = conn.execute("SELECT terminal_statuses() AS statuses").fetchone()
    assert row is not None
    assert row["statuses"] == [s.value for s in TERMINAL_ORDER]
    assert set(row["statuses"]) == TERMINAL


def test_terminal_statuses_fold_to_a_constant(conn: Conn) -> None:
    # Inlined and folded at plan time: the (status, updated) index sees the literal array.
    plan = conn.execute("EXPLAIN SELECT id FROM execution WHERE status = ANY(terminal_statuses())").fetchall()
    text = "\n".join(str(next(iter(r.values()))) for r in plan)
    assert "terminal_statuses" not in text
    assert "{completed,failed,timeout,cancelled,abandoned}" in text


def _sources(conn: Conn) -> dict[str, str]:
    rows = conn.execute(
        "SELECT p.proname, p.prosrc FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace"
    ).fetchall()
    return {r["proname"]: r["prosrc"] for r in rows}


def test_every_channel_the_sql_notifies_is_a_topic_and_back(conn: Conn) -> None:
    notified = {
        m.group(1)
        for src in _sources(conn).values()
        for m in re.finditer(r"pg_notify\(current_schema\(\) \|\| '\.(\w+)", src)
    }
    assert notified == {t.value for t in Topic}


def test_wake_takes_the_topics_named_in_python_and_rings_their_channels(conn: Conn) -> None:
    sources = _sources(conn)
    branches = re.split(r"\b(?:ELS)?IF topic = '(\w+)' THEN", sources["wake"].split("ELSE\n        RAISE")[0])[1:]
    rung = {topic: set(re.findall(r"pg_notify\(current_schema\(\) \|\| '\.(\w+)", body))
            for topic, body in zip(branches[::2], branches[1::2], strict=True)}  # fmt: skip
    assert rung == {topic: {channel.value} for topic, channel in WAKES.items()}
    called = {m.group(1) for src in sources.values() for m in re.finditer(r"\bwake\('(\w+)'", src)}
    assert called <= set(WAKES)


def test_a_channel_name_is_the_one_the_sql_notifies(db_url: str) -> None:
    with connect_sync(db_url, "conveyor", autocommit=True) as listener:
        expected = [channel("conveyor", Topic.EVENT), channel("conveyor", Topic.WORKER, 7)]
        for name in expected:
            listener.execute(listen_statement(name))
        listener.execute("SELECT wake('event'), wake('worker', '{}', '{7}')")
        heard = [n.channel for n in listener.notifies(timeout=5, stop_after=2)]
    assert heard == expected


def test_the_statuses_on_a_worker_are_the_same_in_sql(conn: Conn) -> None:
    row = conn.execute("SELECT on_worker_statuses() AS statuses").fetchone()
    assert row is not None
    assert set(row["statuses"]) == ON_WORKER


def test_a_workers_load_and_free_capacity_are_one_count(conn: Conn) -> None:
    w = add_worker(conn, "w-load", capacity=3)
    conn.execute("UPDATE worker SET capabilities = '{\"prefetch\": 2}' WHERE id = %s", (w,))
    placed = {}
    for target in (S.SCHEDULED, S.RUNNING, S.CANCELING, S.COMPLETED, S.REQUESTED):
        eid = int(conn.execute("INSERT INTO execution (action_ref) VALUES ('core.noop') RETURNING id").fetchone()["id"])
        path = {S.SCHEDULED: [S.SCHEDULING, S.SCHEDULED], S.RUNNING: [S.SCHEDULING, S.SCHEDULED, S.RUNNING],
                S.CANCELING: [S.SCHEDULING, S.SCHEDULED, S.RUNNING, S.CANCELING],
                S.COMPLETED: [S.SCHEDULING, S.SCHEDULED, S.RUNNING, S.COMPLETED], S.REQUESTED: []}[target]  # fmt: skip
        for step in path:
            conn.execute(
                "UPDATE execution SET status = %s, worker = CASE WHEN %s = 'scheduled' THEN %s ELSE worker END,"
                " ended = CASE WHEN %s = 'completed' THEN now() END WHERE id = %s",
                (step, step, w, step, eid),
            )
        placed[eid] = target
    expected = sum(1 for s in placed.values() if s in ON_WORKER)
    assert expected == 3
    live = [LiveWorker(**r) for r in conn.execute(Q["live_workers"]).fetchall() if r["id"] == w]
    listed = [r for r in conn.execute(Q["list_workers"]).fetchall() if r["id"] == w]
    assert [x.load for x in live] == [r["load"] for r in listed] == [expected]
    assert live[0].free == live[0].candidate().free == free_capacity(3, 2, expected) == 2
