"""Inquiries under concurrency and time: answers racing on separate connections (exactly
one completes the execution, the others find it answered), an answer racing a cancel, and
the ttl (fail -> timeout; a default -> answered by 'ttl', audited)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conveyor.store.db import connect_sync
from integration.inquiries.inquiry_kit import Conn, ask, audit, execution, inquiry, past_deadline, respond

SCHEMA = "conveyor"
RACERS = 8


def _race(db_url: str, actions: list[Any]) -> list[Any]:
    """Run each action on its own connection, all released together by a barrier."""
    barrier = threading.Barrier(len(actions))

    def run(action: Any) -> Any:
        with connect_sync(db_url, SCHEMA, autocommit=True) as own:
            barrier.wait(timeout=10)
            return action(own)

    with ThreadPoolExecutor(max_workers=len(actions)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(run, a) for a in actions]]


def test_racing_answers_complete_the_execution_once(db_url: str, conn: Conn) -> None:
    for _ in range(3):  # a few rounds: the interleavings differ
        eid, iid = ask(conn, {"prompt": "who is first?"})
        answers = _race(db_url, [lambda c, n=n, i=iid: respond(c, i, f"op{n}", {"n": n}) for n in range(RACERS)])
        outcomes = sorted(a["outcome"] for a in answers)
        assert outcomes == ["answered"] + ["not_pending"] * (RACERS - 1), answers
        winner = next(a for a in answers if a["outcome"] == "answered")
        done = execution(conn, eid)
        assert done["status"] == "completed"
        assert done["result"]["responders"] == winner["responders"]
        assert len(audit(conn, iid)) == 1  # the losers' answers were not recorded


def test_racing_answers_with_a_quorum(db_url: str, conn: Conn) -> None:
    """Quorum 3, eight racing approvers: three are counted, the third of them completes it,
    the rest are refused; the result names exactly the three."""
    eid, iid = ask(conn, {"prompt": "three approvals", "quorum": 3})
    answers = _race(db_url, [lambda c, n=n: respond(c, iid, f"op{n}", {"n": n}) for n in range(RACERS)])
    outcomes = sorted(a["outcome"] for a in answers)
    assert outcomes == ["answered"] + ["not_pending"] * (RACERS - 3) + ["recorded"] * 2, answers
    who = [r[0] for r in audit(conn, iid)]
    assert len(who) == 3
    assert execution(conn, eid)["result"]["responders"] == who


def test_the_same_responder_racing_itself_counts_once(db_url: str, conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "two approvals", "quorum": 2})
    answers = _race(db_url, [lambda c: respond(c, iid, "alice", {"ok": True}) for _ in range(4)])
    assert sorted(a["outcome"] for a in answers) == ["already_responded"] * 3 + ["recorded"]
    assert execution(conn, eid)["status"] == "pending"
    assert [r[0] for r in audit(conn, iid)] == ["alice"]


def test_an_answer_racing_a_cancel_ends_it_one_way(db_url: str, conn: Conn) -> None:
    for _ in range(3):
        eid, iid = ask(conn, {"prompt": "q"})
        answer, cancel = _race(db_url, [
            lambda c, i=iid: respond(c, i, "alice"),
            lambda c, e=eid: c.execute("SELECT * FROM cancel_execution(%s, 'ops')", (e,)).fetchone(),
        ])  # fmt: skip
        status, inquiry_status = execution(conn, eid)["status"], inquiry(conn, iid)["status"]
        if answer["outcome"] == "answered":
            assert (status, inquiry_status, cancel["now"]) == ("completed", "responded", None)
        else:
            assert answer["outcome"] == "not_pending"
            assert (status, inquiry_status, cancel["now"]) == ("cancelled", "cancelled", "cancelled")


def test_ttl_fail_times_the_execution_out(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "q", "ttl": 30})
    assert conn.execute("SELECT * FROM expire_inquiries()").fetchall() == []  # not due yet
    past_deadline(conn, iid)
    assert conn.execute("SELECT * FROM expire_inquiries()").fetchall() == [
        {"inquiry": iid, "execution": eid, "outcome": "timeout"}
    ]
    done = execution(conn, eid)
    assert done["status"] == "timeout"
    assert inquiry(conn, iid)["status"] == "timeout"
    assert done["result"]["succeeded"] is False, done["result"]
    assert "ttl of 30" in done["result"]["error"], done["result"]
    assert respond(conn, iid, "alice")["outcome"] == "not_pending"
    assert conn.execute("SELECT * FROM expire_inquiries()").fetchall() == []  # once


def test_ttl_default_answers_with_it(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "q", "ttl": 30, "quorum": 2, "on_timeout": {"default": {"approved": False}}})
    assert respond(conn, iid, "alice", {"approved": True})["outcome"] == "recorded"
    past_deadline(conn, iid)
    assert conn.execute("SELECT outcome FROM expire_inquiries()").fetchall() == [{"outcome": "default"}]
    done = execution(conn, eid)
    assert done["status"] == "completed"
    assert (done["result"]["response"], done["result"]["responders"], done["result"]["timed_out"]) == (
        {"approved": False}, ["alice", "ttl"], True)  # fmt: skip
    assert audit(conn, iid) == [("alice", "operator", {"approved": True}), ("ttl", None, {"approved": False})]
    assert inquiry(conn, iid)["response"] == {"approved": False}


def test_ttl_without_deadline_waits(conn: Conn) -> None:
    eid, iid = ask(conn, {"prompt": "no ttl"})
    assert inquiry(conn, iid)["deadline"] is None
    conn.execute("UPDATE inquiry SET created = now() - interval '10 years' WHERE id = %s", (iid,))
    assert conn.execute("SELECT * FROM expire_inquiries()").fetchall() == []
    assert execution(conn, eid)["status"] == "pending"


def test_expiry_skips_an_inquiry_being_answered(db_url: str, conn: Conn) -> None:
    """expire_inquiries on every replica at once, and an answer in flight: rows another
    transaction holds are skipped, not waited for, and each inquiry ends once."""
    eid, iid = ask(conn, {"prompt": "q", "ttl": 30})
    past_deadline(conn, iid)
    with connect_sync(db_url, SCHEMA) as holder:  # a transaction holding the execution row
        holder.execute("SELECT 1 FROM execution WHERE id = %s FOR NO KEY UPDATE", (eid,))
        assert conn.execute("SELECT * FROM expire_inquiries()").fetchall() == []
        holder.rollback()
    results = _race(db_url, [lambda c: c.execute("SELECT * FROM expire_inquiries()").fetchall() for _ in range(4)])
    assert sorted(len(r) for r in results) == [0, 0, 0, 1]
    assert execution(conn, eid)["status"] == "timeout"
