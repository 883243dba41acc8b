"""The inquiry verb (respond) through both drivers: the same answers, the same refusals;
an answer the schema refuses is refused before ``respond_inquiry``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.domain.errors import ConflictError, ForbiddenError, InvalidAnswerError, NotFoundError
from conveyor.store.db import Conn, Pool
from conveyor.verbs import inquiries
from conveyor.verbs.drive import Verb, run
from integration.inquiries.inquiry_kit import ask, audit
from integration.verbs.both_drivers import both, both_refuse

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


async def test_respond_records_then_answers(conn: Conn, pool: Pool) -> None:
    eid, iid = ask(conn, {"prompt": "ok?", "schema": SCHEMA, "quorum": 2})
    # Each driver answers as a different responder: the first is recorded, the second answers.
    answers = iter(("alice", "bob"))
    recorded, answered = await both(
        conn, pool, lambda: inquiries.respond(iid, {"ok": True}, responder=next(answers), role="operator")
    )
    assert recorded == {
        "id": iid,
        "outcome": "recorded",
        "status": "pending",
        "execution": eid,
        "responders": ["alice"],
    }
    assert answered == {**recorded, "outcome": "answered", "status": "responded", "responders": ["alice", "bob"]}
    assert audit(conn, iid) == [("alice", "operator", {"ok": True}), ("bob", "operator", {"ok": True})]


async def test_refusals(conn: Conn, pool: Pool) -> None:
    _, iid = ask(conn, {"prompt": "ok?", "schema": SCHEMA, "assignees": ["alice", "carol"], "quorum": 2})

    def answer(who: str, data: object) -> Callable[[], Verb[dict[str, Any]]]:
        return lambda: inquiries.respond(iid, data, responder=who, role="operator")

    invalid = await both_refuse(conn, pool, answer("alice", {"ok": "yes"}), InvalidAnswerError)
    assert "data.ok" in invalid
    assert audit(conn, iid) == []  # refused before the database saw it
    forbidden = await both_refuse(conn, pool, answer("bob", {"ok": True}), ForbiddenError)
    assert forbidden == f"'bob' is not an assignee of inquiry {iid}"
    for missing in (iid + 1000, 0, 2**70):
        message = await both_refuse(
            conn, pool, lambda m=missing: inquiries.respond(m, {}, responder="alice", role="admin"), NotFoundError
        )
        assert message == f"no inquiry with id {missing} (see `conveyor inquiries list`)"
    run(conn, answer("alice", {"ok": True})())
    again = await both_refuse(conn, pool, answer("alice", {"ok": False}), ConflictError)
    assert again == f"'alice' already answered inquiry {iid}: it needs another responder"
