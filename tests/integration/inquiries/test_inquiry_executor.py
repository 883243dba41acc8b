"""The executor's side of inquiries, without processes: a scheduling round asks core.ask
executions whatever the workers (none here), fails the ones nobody could answer with the
reason, leaves them pending (no worker slot, no "no workers available"); the SDK answers
them (the schema checked first, each problem's path named) and a wait returns the answer."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from conveyor.domain.errors import ConflictError, ConveyorError, ForbiddenError, InvalidAnswerError, NotFoundError
from conveyor.executor.scheduler import RoundResult
from conveyor.sdk import Client, request_executions
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport
from integration.builders import Conn, Pool, add_worker, request, rows, scheduler
from integration.inquiries.inquiry_kit import audit

SCHEMA = "conveyor"
APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
            "required": ["approved"], "additionalProperties": False}  # fmt: skip


async def test_a_round_asks_inquiries_with_no_worker_at_all(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    ids = request(conn, 2, "core.ask", {"prompt": "ok?"})
    result = await scheduler(pool, transport, no_worker_grace=0).run_round()
    assert result == RoundResult(claimed=2, dispatched=0, failed=0, handed_back=0, asked=2)
    for row in rows(conn, ids).values():
        assert (row["status"], row["worker"], row["attempt"], row["executor"]) == ("pending", None, 0, "ex-test")
        assert row["started"] is not None
    asked = conn.execute("SELECT execution FROM inquiry ORDER BY execution").fetchall()
    assert [r["execution"] for r in asked] == ids
    # Pending: nothing more for the next rounds (no "no workers available").
    assert await scheduler(pool, transport).run_round() == RoundResult(0, 0, 0, 0)


async def test_inquiries_are_asked_while_every_worker_is_full(
    conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    add_worker(conn, "w1", capacity=1)
    noops = request(conn, 2, "core.noop")
    ask = request(conn, 1, "core.ask", {"prompt": "ok?"})[0]
    result = await scheduler(pool, transport).run_round()
    assert (result.dispatched, result.asked) == (1, 1)
    assert rows(conn, [ask])[ask]["status"] == "pending"
    assert sorted(r["status"] for r in rows(conn, noops).values()) == ["requested", "scheduled"]


def test_picking_executor_run_work_does_not_scan_the_backlog(conn: Conn) -> None:
    """pick_executor_run runs every round: behind thousands of requested worker-run
    executions it must reach the few core.ask / workflow ones through the index, not walk
    the backlog (it did: 5 ms a round behind 20,000, a plan chosen from the statistics)."""
    with conn.transaction():
        request_executions(conn, [("core.noop", {})] * 3000)
    ask = request(conn, 1, "core.ask", {"prompt": "ok?"})[0]
    conn.execute("ANALYZE execution")
    with conn.transaction():
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q["pick_executor_run"], {"limit": 500}).fetchone()
        picked = conn.execute(Q["pick_executor_run"], {"limit": 500}).fetchall()
    assert plan is not None
    assert [r["id"] for r in picked] == [ask]
    nodes = _nodes(plan["QUERY PLAN"][0]["Plan"])
    read = sum(n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) for n in nodes
               if n.get("Relation Name") == "execution")  # fmt: skip
    assert read < 50, f"{read} execution rows read to pick one"


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ({"prompt": "q", "schema": {"type": "nope"}}, "schema.type: not a valid JSON Schema"),
        ({"prompt": "q", "schema": APPROVAL, "on_timeout": {"default": {"approved": "no"}}},
         "on_timeout.default: not a valid answer (data.approved: 'no' is not of type 'boolean')"),
        ({"prompt": "q", "assignees": ["alice", "bob"], "quorum": 3},
         "quorum: 3 distinct responders needed but only 2 assignees named"),
        ({"prompt": "q", "quorum": 0}, "quorum: 0 is less than the minimum of 1"),
    ],
)  # fmt: skip
async def test_an_inquiry_nobody_could_answer_fails_at_once(
    conn: Conn, pool: Pool, transport: PostgresTransport, parameters: dict[str, Any], error: str
) -> None:
    # Inserted as an operator's SQL would (request_execution's own checks would refuse some).
    eid = conn.execute("INSERT INTO execution (action_ref, parameters) VALUES ('core.ask', %s) RETURNING id",
                       (Jsonb(parameters),)).fetchone()["id"]  # fmt: skip
    result = await scheduler(pool, transport).run_round()
    assert (result.failed, result.asked) == (1, 0)
    row = rows(conn, [eid])[eid]
    assert row["status"] == "failed", row["result"]
    assert error in row["result"]["error"], row["result"]
    assert conn.execute("SELECT count(*)::int AS n FROM inquiry").fetchone() == {"n": 0}


async def test_the_sdk_answers_and_a_wait_returns_the_answer(
    db_url: str, conn: Conn, pool: Pool, transport: PostgresTransport
) -> None:
    with Client(db_url, SCHEMA, user="alice") as client:
        eid = client.request("core.ask", {"prompt": "deploy?", "schema": APPROVAL, "forbid_requester": True})
        assert client.get(eid).requested_by == "alice"
        await scheduler(pool, transport).run_round()
        [inquiry] = client.inquiries(status="pending")
        assert (inquiry["execution"], inquiry["requester"], inquiry["responders"]) == (eid, "alice", [])
        with pytest.raises(InvalidAnswerError) as invalid:
            client.respond(inquiry["id"], {"approved": "yes", "extra": 1}, responder="bob")
        assert invalid.value.problems == [
            ("data", "Additional properties are not allowed ('extra' was unexpected)"),
            ("data.approved", "'yes' is not of type 'boolean'"),
        ]
        with pytest.raises(ForbiddenError, match="'alice' requested this execution"):
            client.respond(inquiry["id"], {"approved": True})
        with pytest.raises(NotFoundError, match="no inquiry with id 99999"):
            client.respond(99999, {"approved": True}, responder="bob")
        waited: list[Any] = []

        def wait() -> None:
            with Client(db_url, SCHEMA) as other:
                waited.append(other.wait(eid, timeout=30))

        waiter = threading.Thread(target=wait)
        waiter.start()
        answer = client.respond(inquiry["id"], {"approved": True, "note": "go"}, responder="bob", role="operator")
        assert (answer["outcome"], answer["status"], answer["responders"]) == ("answered", "responded", ["bob"])
        waiter.join(timeout=30)
        assert waited
        assert waited[0].status == "completed"
        assert waited[0].result["response"] == {"approved": True, "note": "go"}
        with pytest.raises(ConflictError, match="is responded: it takes no more answers"):
            client.respond(inquiry["id"], {"approved": False}, responder="carol")
        full = client.inquiry(inquiry["id"])
        assert [(r["responder"], r["role"], r["data"]) for r in full["responses"]] == audit(conn, inquiry["id"])
    with Client(db_url, SCHEMA) as nobody, pytest.raises(ConveyorError, match="who answers"):
        nobody.respond(inquiry["id"], {"approved": True})


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan node and every node under it."""
    return [plan, *(n for sub in plan.get("Plans", []) for n in _nodes(sub))]
