"""Acceptance: an inquiry asked by ``conveyor run core.ask --wait`` and answered from the
command line, with a real executor process (no worker: an inquiry needs none)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually

pytestmark = pytest.mark.acceptance

APPROVAL = json.dumps({"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]})


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, CONVEYOR_USER="alice")


def _pending(procs: Procs) -> dict[str, Any]:
    def one() -> dict[str, Any] | None:
        rows = procs.json("inquiries", "list")
        return rows[0] if rows else None

    return eventually(one, 20, interval=0.1, message=procs.logs)


def test_an_inquiry_answered_from_the_cli(procs: Procs) -> None:
    procs.start("executor", name="executor")
    asking = procs.start("run", "core.ask", "prompt=Deploy to production?", f"schema={APPROVAL}",
                         "forbid_requester=true", "--wait", "--json", name="ask")  # fmt: skip
    inquiry = _pending(procs)
    assert (inquiry["prompt"], inquiry["requester"], inquiry["status"]) == ("Deploy to production?", "alice", "pending")
    iid = str(inquiry["id"])
    shown = procs.run("inquiries", "get", iid)
    assert shown.returncode == 0, describe(shown)
    assert "Deploy to production?" in shown.stdout, describe(shown)
    assert asking.returncode is None  # pending is not terminal: `run --wait` still waits

    invalid = procs.run("inquiries", "respond", iid, "--data", '{"approved": "sure"}')
    assert invalid.returncode == 1, describe(invalid)
    assert invalid.stderr.strip() == (f"error: invalid answer for inquiry {iid}: data.approved: 'sure' is not of type "
                                      "'boolean'"), describe(invalid)  # fmt: skip
    not_json = procs.run("inquiries", "respond", iid, "--data", "{approved")
    assert not_json.returncode == 1, describe(not_json)
    assert not_json.stderr.startswith("error: --data is not JSON"), describe(not_json)
    assert "Traceback" not in invalid.stderr + not_json.stderr
    mine = procs.run("inquiries", "respond", iid, "--data", '{"approved": true}')  # alice requested it
    assert mine.returncode == 1, describe(mine)
    assert "'alice' requested this execution" in mine.stderr, describe(mine)

    answered = procs.run("inquiries", "respond", iid, "--data", '{"approved": true}', "--as", "bob")
    assert answered.returncode == 0, describe(answered)
    assert f"inquiry {iid} answered; execution {inquiry['execution']} completed" in answered.stdout
    assert asking.wait(20) == 0, procs.logs()
    result = json.loads(asking.stdout())
    assert result["status"] == "completed", result
    assert (result["result"]["response"], result["result"]["responders"]) == ({"approved": True}, ["bob"])
    again = procs.run("inquiries", "respond", iid, "--data", '{"approved": false}', "--as", "carol")
    assert again.returncode == 1, describe(again)
    assert "is responded: it takes no more answers" in again.stderr, describe(again)
    audit = procs.json("inquiries", "get", iid)["responses"]
    assert [(r["responder"], r["role"], r["data"]) for r in audit] == [("bob", "admin", {"approved": True})]


def test_ttl_with_a_default_answer(procs: Procs) -> None:
    procs.start("executor", name="executor", env={**procs.env, "CONVEYOR__EXECUTOR__INQUIRY_CHECK_INTERVAL": "0.2"})
    result = procs.run("run", "core.ask", "prompt=Proceed?", "ttl=1", 'on_timeout={"default": "yes"}', "--wait",
                       "--json", "--timeout", "30")  # fmt: skip
    assert result.returncode == 0, describe(result)
    execution = json.loads(result.stdout)
    assert (execution["result"]["response"], execution["result"]["responders"]) == ("yes", ["ttl"]), execution
