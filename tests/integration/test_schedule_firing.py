"""The set-based firing pass (migration 0020): every slot of a pass in one statement, and
still each slot's own outcome -- a refused request is that slot's 'request_error' with
request_execution's (or emit_event's) very message, the others fire; a slot decided
already requests nothing; one INSERT requests every execution of a pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.executor.schedules import Firer
from conveyor.sdk import Client
from integration.builders import Conn, client_of
from integration.test_schedules import backdate, slots

Pool = AsyncConnectionPool[Any]
STRICT = {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}}


@pytest.fixture
def client(conn: Conn) -> Iterator[Client]:
    with client_of(conn) as c:
        yield c


def refusal(conn: Conn, sql: str, args: tuple[Any, ...]) -> str:
    """The message the one-request door gives for the same request."""
    with pytest.raises(psycopg.Error) as caught, conn.transaction():
        conn.execute(sql, args)
    return str(caught.value.diag.message_primary)


async def test_a_refused_slot_is_its_own_request_error(conn: Conn, pool: Pool, client: Client) -> None:
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema) "
        "VALUES ('t.strict', 't', 'strict', 'python', 'python', %s)",
        (Jsonb({"type": "object"}),),
    )
    client.create_schedule("good", every=1, action="core.noop")
    client.create_schedule("params", every=1, action="t.strict", parameters={"x": "one"})
    client.create_schedule("gone", every=1, action="core.noop")
    client.create_schedule("payload", every=1)
    # Since created: the action's schema tightened, an action vanished, the trigger got a schema.
    conn.execute("UPDATE action SET parameters_schema = %s WHERE ref = 't.strict'", (Jsonb(STRICT),))
    conn.execute("UPDATE schedule SET action_ref = 'nope.gone' WHERE name = 'gone'")
    conn.execute("UPDATE trigger SET payload_schema = %s WHERE name = 'payload'",
                 (Jsonb({"type": "object", "required": ["nothere"]}),))  # fmt: skip
    for name in ("good", "params", "gone", "payload"):
        backdate(conn, name, 2.5)
    before = conn.execute("SELECT count(*) AS n FROM execution").fetchone()
    assert before is not None

    picked = await Firer(pool, batch_size=100).run_pass()
    assert picked.picked == 4
    assert picked.slots == 8
    assert [r["outcome"] for r in slots(conn, "good")] == ["requested", "requested"]
    for name in ("params", "gone", "payload"):
        assert [r["outcome"] for r in slots(conn, name)] == ["request_error", "request_error"], name
        assert all(r["execution"] is None and r["event"] is None for r in slots(conn, name))
    assert slots(conn, "params")[0]["error"] == refusal(
        conn, "SELECT request_execution('t.strict', %s)", (Jsonb({"x": "one"}),)
    )
    assert slots(conn, "gone")[0]["error"] == refusal(conn, "SELECT request_execution('nope.gone', '{}')", ())
    first = slots(conn, "payload")[0]
    payload = {"schedule": "payload", "slot": first["slot"].isoformat(), "origin": "scheduled"}
    assert first["error"] == refusal(conn, "SELECT emit_event('payload', %s, 'schedule')", (Jsonb(payload),))
    after = conn.execute("SELECT count(*) AS n FROM execution").fetchone()
    assert after is not None
    assert after["n"] - before["n"] == 2  # the good schedule's two slots, nothing else
    sched = conn.execute("SELECT count(*) FILTER (WHERE next_fire > now()) AS later FROM schedule").fetchone()
    assert sched == {"later": 4}  # every schedule moved on, refused or not


async def test_a_slot_decided_already_requests_nothing(conn: Conn, pool: Pool, client: Client) -> None:
    client.create_schedule("tick", every=1, action="core.noop")
    backdate(conn, "tick", 3.5)
    # Another replica (or an earlier, committed pass) decided the middle slot already.
    decided = conn.execute(
        "SELECT s.id, s.next_fire + interval '2 s' AS slot FROM schedule s WHERE s.name = 'tick'"
    ).fetchone()
    assert decided is not None
    conn.execute("INSERT INTO schedule_slot (schedule, slot, outcome, fired) VALUES (%s, %s, 'skipped', now())",
                 (decided["id"], decided["slot"]))  # fmt: skip
    await Firer(pool, batch_size=100).run_pass()
    rows = slots(conn, "tick")
    assert [r["outcome"] for r in rows] == ["requested", "skipped", "requested"]
    mine = conn.execute("SELECT count(*) AS n FROM execution WHERE requested_by = 'schedule:tick'").fetchone()
    assert mine == {"n": 2}  # no execution for the slot it did not insert
    assert {r["execution"] for r in rows if r["execution"]} == {
        r["id"] for r in conn.execute("SELECT id FROM execution WHERE requested_by = 'schedule:tick'").fetchall()
    }


async def test_a_hundred_schedules_in_one_pass(conn: Conn, pool: Pool, client: Client) -> None:
    for i in range(100):
        client.create_schedule(f"s{i}", every=1, action="core.noop")
    conn.execute("UPDATE schedule SET next_fire = now() - interval '0.5 s', updated = now() - interval '1.5 s', "
                 "created = now() - interval '1.5 s'")  # fmt: skip
    result = await Firer(pool, batch_size=100).run_pass()
    assert result.picked == 100
    rows = conn.execute(
        "SELECT ss.outcome, ss.execution, e.requested_by, 'schedule:' || s.name AS expected FROM schedule_slot ss "
        "JOIN schedule s ON s.id = ss.schedule LEFT JOIN execution e ON e.id = ss.execution"
    ).fetchall()
    assert len(rows) == result.slots >= 100
    assert {r["outcome"] for r in rows} == {"requested"}
    assert len({r["execution"] for r in rows}) == len(rows)
    assert all(r["requested_by"] == r["expected"] for r in rows)
