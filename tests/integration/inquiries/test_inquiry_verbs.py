"""The inquiry verbs on the real database (migration 0013): ask_inquiries (create-or-get,
one announcement), respond_inquiry (assignees, roles, the forbidden requester, quorum,
the audit), cancel_execution of a pending inquiry, and who the requester is."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.store.db import connect_sync
from integration.inquiries.inquiry_kit import (
    EXECUTOR,
    Conn,
    ask,
    ask_once,
    audit,
    claim,
    execution,
    inquiry,
    request_ask,
    respond,
)

SCHEMA = "conveyor"


def _announcements(db_url: str, conn: Conn, act: Any) -> tuple[list[str], int]:
    """What ``act`` announced: the NOTIFY payloads on <schema>.inquiry (read up to a marker
    sent after it, so none is missed and none waited for) and the outbox's inquiry.created
    messages (the route is RabbitMQ's for this)."""
    conn.execute("UPDATE transport_route SET transport = 'rabbitmq'")
    with connect_sync(db_url, SCHEMA, autocommit=True) as listener:
        listener.execute('LISTEN "conveyor.inquiry"')
        act()
        conn.execute("SELECT pg_notify('conveyor.inquiry', 'marker')")
        payloads: list[str] = []
        for note in listener.notifies(timeout=10):
            if note.payload == "marker":
                break
            payloads.append(note.payload)
    outbox = conn.execute("SELECT count(*)::int AS n FROM outbox WHERE message_type = 'inquiry.created'").fetchone()
    assert outbox is not None
    return payloads, int(outbox["n"])


def test_ask_creates_one_inquiry_and_announces_it_once(db_url: str, conn: Conn) -> None:
    eid = request_ask(conn, {"prompt": "deploy?", "assignees": ["alice", "operator"], "ttl": 60, "quorum": 2,
                             "schema": {"type": "object"}, "forbid_requester": True}, by="bob")  # fmt: skip
    claim(conn, eid)
    answers: list[list[dict[str, Any]]] = []

    def twice() -> None:
        answers.append(ask_once(conn, eid))
        answers.append(ask_once(conn, eid))  # a repeat: the execution is pending already

    payloads, messages = _announcements(db_url, conn, twice)
    iid = answers[0][0]["inquiry"]
    assert answers == [[{"execution": eid, "inquiry": iid, "created": True}], []]
    assert payloads == [str(iid)]
    assert messages == 1
    row = inquiry(conn, iid)
    assert (row["status"], row["prompt"], row["assignees"], row["quorum"], row["forbid_requester"], row["requester"],
            row["on_timeout"]) == ("pending", "deploy?", ["alice", "operator"], 2, True, "bob", "fail")  # fmt: skip
    ttl = conn.execute("SELECT deadline - created AS ttl FROM inquiry WHERE id = %s", (iid,)).fetchone()
    assert ttl is not None
    assert ttl["ttl"].total_seconds() == 60
    assert execution(conn, eid)["status"] == "pending"


def test_an_existing_inquiry_is_kept_and_not_announced_again(db_url: str, conn: Conn) -> None:
    """The seed's dedupe: an execution asked again (here: its inquiry made by an earlier,
    duplicate ask) gets the inquiry it has, and nobody is told of a new one."""
    eid = request_ask(conn, {"prompt": "first"})
    claim(conn, eid)
    conn.execute("INSERT INTO inquiry (execution, prompt) VALUES (%s, 'first')", (eid,))
    before = conn.execute("SELECT id FROM inquiry WHERE execution = %s", (eid,)).fetchone()
    assert before is not None
    answers: list[list[dict[str, Any]]] = []
    payloads, messages = _announcements(db_url, conn, lambda: answers.append(ask_once(conn, eid)))
    assert answers == [[{"execution": eid, "inquiry": before["id"], "created": False}]]
    assert payloads == []
    assert messages == 0
    assert execution(conn, eid)["status"] == "pending"


def test_only_the_claimant_asks(conn: Conn) -> None:
    eid = request_ask(conn, {"prompt": "q"})
    claim(conn, eid, executor="other")
    assert ask_once(conn, eid, executor=EXECUTOR) == []
    assert conn.execute("SELECT count(*)::int AS n FROM inquiry").fetchone() == {"n": 0}
    assert execution(conn, eid)["status"] == "scheduling"


def test_one_answer_completes_the_execution(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "ok?"})
    assert respond(conn, iid, "alice", {"ok": True}) == {
        "outcome": "answered", "inquiry": iid, "execution": eid, "status": "responded", "responders": ["alice"]
    }  # fmt: skip
    done = execution(conn, eid)
    assert done["status"] == "completed"
    assert done["ended"] is not None
    assert done["result"] == {"succeeded": True, "response": {"ok": True}, "responders": ["alice"],
                              "responses": [{"responder": "alice", "data": {"ok": True}}]}  # fmt: skip
    row = inquiry(conn, iid)
    assert (row["status"], row["response"]) == ("responded", {"ok": True})
    assert row["responded"] is not None
    assert respond(conn, iid, "bob")["outcome"] == "not_pending"
    assert audit(conn, iid) == [("alice", "operator", {"ok": True})]


def test_unknown_inquiry(conn: Conn) -> None:
    assert respond(conn, 424242, "alice")["outcome"] == "not_found"


@pytest.mark.parametrize(
    ("assignees", "responder", "role", "outcome"),
    [
        ([], "anyone", "operator", "answered"),  # none assigned: operators and admins
        ([], "anyone", "admin", "answered"),
        ([], "anyone", "viewer", "not_assignee"),
        (["alice"], "alice", "viewer", "answered"),  # named: whatever the role
        (["alice"], "bob", "admin", "not_assignee"),  # only the named ones
        (["operator"], "bob", "operator", "answered"),  # a role: that one or higher
        (["operator"], "bob", "admin", "answered"),
        (["operator"], "bob", "viewer", "not_assignee"),
        (["admin", "carol"], "bob", "operator", "not_assignee"),
        (["viewer"], "bob", "viewer", "answered"),
    ],
)
def test_who_may_answer(conn: Conn, assignees: list[str], responder: str, role: str, outcome: str) -> None:
    eid, iid = ask(conn, {"prompt": "q", "assignees": assignees})
    assert respond(conn, iid, responder, role=role)["outcome"] == outcome
    assert execution(conn, eid)["status"] == ("completed" if outcome == "answered" else "pending")
    assert len(audit(conn, iid)) == (1 if outcome == "answered" else 0)  # a refusal records nothing


def test_the_requester_may_be_forbidden(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "approve my change?", "forbid_requester": True}, by="alice")
    assert respond(conn, iid, "alice", role="admin")["outcome"] == "requester_forbidden"
    assert execution(conn, eid)["status"] == "pending"
    assert respond(conn, iid, "bob")["outcome"] == "answered"
    # Without the option the requester may answer.
    _, allowed = ask(conn, {"prompt": "mine"}, by="alice")
    assert respond(conn, allowed, "alice")["outcome"] == "answered"


def test_a_workflow_task_names_the_root_requester(conn: Conn) -> None:
    """An inquiry asked inside a workflow (a child, a grandchild) forbids the person who
    started the workflow: the root execution's requester, not the executor's (nobody)."""
    root = request_ask(conn, {"prompt": "stands in for the workflow"}, by="alice")
    child = request_ask(conn, {"prompt": "stands in for a sub-workflow"}, parent=root)
    _, iid = ask(conn, {"prompt": "approve?", "forbid_requester": True}, parent=child)
    assert inquiry(conn, iid)["requester"] == "alice"
    assert respond(conn, iid, "alice")["outcome"] == "requester_forbidden"


def test_quorum_needs_distinct_responders_and_audits_each(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "two approvals", "quorum": 2, "assignees": ["operator"]})
    assert respond(conn, iid, "alice", {"v": 1})["outcome"] == "recorded"
    again = respond(conn, iid, "alice", {"v": 9})
    assert (again["outcome"], again["responders"]) == ("already_responded", ["alice"])
    assert execution(conn, eid)["status"] == "pending"
    assert inquiry(conn, iid)["status"] == "pending"
    answered = respond(conn, iid, "bob", {"v": 2}, role="admin")
    assert (answered["outcome"], answered["responders"]) == ("answered", ["alice", "bob"])
    result = execution(conn, eid)["result"]
    assert result["response"] == {"v": 2}
    assert result["responders"] == ["alice", "bob"]
    assert audit(conn, iid) == [("alice", "operator", {"v": 1}), ("bob", "admin", {"v": 2})]
    created = conn.execute("SELECT bool_and(created IS NOT NULL) AS ok FROM inquiry_response").fetchone()
    assert created == {"ok": True}


def test_cancel_cancels_a_pending_inquiry(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "q"})
    row = conn.execute("SELECT * FROM cancel_execution(%s, 'ops')", (eid,)).fetchone()
    assert row is not None
    assert (row["was"], row["now"]) == ("pending", "cancelled")
    assert execution(conn, eid)["status"] == "cancelled"
    assert inquiry(conn, iid)["status"] == "cancelled"
    assert respond(conn, iid, "alice")["outcome"] == "not_pending"
    # A finished one is left alone (nothing to cancel), its inquiry too.
    done, answered = ask(conn, {"prompt": "q"})
    respond(conn, answered, "alice")
    row = conn.execute("SELECT * FROM cancel_execution(%s, 'ops')", (done,)).fetchone()
    assert row is not None
    assert row["now"] is None
    assert inquiry(conn, answered)["status"] == "responded"


def test_an_answer_after_the_execution_ended_otherwise_is_refused(conn: Conn) -> None:
    """An operator's SQL ended the execution without its inquiry: no answer completes it
    twice, and expire_inquiries closes the orphan."""
    eid, iid = ask(conn, {"prompt": "q"})
    conn.execute("UPDATE execution SET status = 'failed', ended = now() WHERE id = %s", (eid,))
    assert respond(conn, iid, "alice")["outcome"] == "not_pending"
    assert conn.execute("SELECT * FROM expire_inquiries()").fetchall() == [
        {"inquiry": iid, "execution": eid, "outcome": "closed"}
    ]
    assert inquiry(conn, iid)["status"] == "cancelled"
    assert execution(conn, eid)["status"] == "failed"
