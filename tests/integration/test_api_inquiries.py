"""``/api/v1/inquiries``: list, get, respond as the bearer token (its name and role):
422 naming each path of an answer the schema refuses, 403 for who may not answer, 404,
409 for an inquiry no longer pending or a token answering twice; the requester of
``POST /api/v1/executions`` is its token."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.api.auth import Role, create_token
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import Api, error_of
from integration.builders import scheduler

APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["approved"]}  # fmt: skip


async def _ask(api: Api, transport: PostgresTransport, role: str = "operator", **parameters: Any) -> tuple[int, int]:
    """core.ask requested through the API as ``role``'s token and asked by a round: (execution, inquiry)."""
    body = {"action_ref": "core.ask", "parameters": {"prompt": "ok?", **parameters}}
    response = await api.post("/api/v1/executions", role=role, json=body)
    assert response.status_code == 201, response.text
    eid = response.json()["id"]
    assert response.json()["requested_by"] == f"test {role}"
    await scheduler(api.pool, transport).run_round()
    row = await api.one("SELECT id FROM inquiry WHERE execution = %s", (eid,))
    return eid, int(row["id"])


async def _token(api: Api, name: str, role: Role) -> dict[str, str]:
    async with api.pool.connection() as conn:
        token, _ = await create_token(conn, name, role)
    return {"Authorization": f"Bearer {token}"}


async def test_list_get_and_answer(api: Api, transport: PostgresTransport) -> None:
    eid, iid = await _ask(api, transport, schema=APPROVAL, assignees=["operator"], ttl=600)
    listed = (await api.get("/api/v1/inquiries", params={"status": "pending"})).json()
    assert [(i["id"], i["execution"], i["status"], i["schema"]) for i in listed["items"]] == [
        (iid, eid, "pending", APPROVAL)
    ]
    assert listed["next_cursor"] is None
    one = (await api.get(f"/api/v1/inquiries/{iid}")).json()
    assert (one["prompt"], one["assignees"], one["requester"], one["ttl"], one["responses"]) == (
        "ok?", ["operator"], "test operator", 600, [])  # fmt: skip
    response = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": {"approved": True}})
    assert response.status_code == 200, response.text
    assert response.json() == {"id": iid, "outcome": "answered", "status": "responded", "execution": eid,
                               "responders": ["test operator"]}  # fmt: skip
    execution = (await api.get(f"/api/v1/executions/{eid}")).json()
    assert execution["status"] == "completed"
    assert (execution["result"]["response"], execution["result"]["responders"]) == (
        {"approved": True}, ["test operator"])  # fmt: skip
    audit = (await api.get(f"/api/v1/inquiries/{iid}")).json()["responses"]
    assert [(r["responder"], r["role"], r["data"]) for r in audit] == [
        ("test operator", "operator", {"approved": True})
    ]
    assert (await api.get("/api/v1/inquiries", params={"status": "pending"})).json()["items"] == []
    assert [i["id"] for i in (await api.get("/api/v1/inquiries")).json()["items"]] == [iid]


async def test_an_invalid_answer_is_422_naming_every_path(api: Api, transport: PostgresTransport) -> None:
    _, iid = await _ask(api, transport, schema=APPROVAL)
    response = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": {"approved": "yes", "reason": 7}})
    message = error_of(response, 422)
    assert "data.approved: 'yes' is not of type 'boolean'" in message
    assert "data.reason: 7 is not of type" in message
    assert response.json()["problems"] == [
        {"field": "data.approved", "message": "'yes' is not of type 'boolean'"},
        {"field": "data.reason", "message": "7 is not of type 'string'"},
    ]
    missing = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": {}})
    assert "data: 'approved' is a required property" in error_of(missing, 422)
    no_data = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"answer": {}})
    assert "data: Field required" in error_of(no_data, 422)
    assert (await api.one("SELECT count(*)::int AS n FROM inquiry_response"))["n"] == 0


async def test_who_may_answer(api: Api, transport: PostgresTransport) -> None:
    _eid, iid = await _ask(api, transport, assignees=["alice", "admin"])
    refused = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": 1}, role="operator")
    assert error_of(refused, 403) == f"'test operator' is not an assignee of inquiry {iid}"
    alice = await _token(api, "alice", Role.viewer)  # named: a viewer may answer
    response = await api.client.post(f"/api/v1/inquiries/{iid}/respond", json={"data": 1}, headers=alice)
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "answered", response.text
    late = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": 2}, role="admin")
    assert error_of(late, 409) == f"inquiry {iid} is responded: it takes no more answers"
    unauthenticated = await api.client.post(f"/api/v1/inquiries/{iid}/respond", json={"data": 2})
    assert unauthenticated.status_code == 401


async def test_the_requester_is_refused_when_forbidden(api: Api, transport: PostgresTransport) -> None:
    _, iid = await _ask(api, transport, role="admin", forbid_requester=True)
    response = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": "mine"}, role="admin")
    assert "'test admin' requested this execution" in error_of(response, 403)
    assert (await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": "ok"})).status_code == 200


async def test_quorum_and_answering_twice(api: Api, transport: PostgresTransport) -> None:
    eid, iid = await _ask(api, transport, quorum=2)
    first = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": "yes"})
    assert first.json()["outcome"] == "recorded"
    assert first.json()["status"] == "pending"
    again = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": "yes"})
    assert error_of(again, 409) == f"'test operator' already answered inquiry {iid}: it needs another responder"
    listed = (await api.get("/api/v1/inquiries")).json()["items"]
    assert listed[0]["responders"] == ["test operator"]
    second = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": "yes"}, role="admin")
    assert second.json()["outcome"] == "answered"
    assert (await api.get(f"/api/v1/executions/{eid}")).json()["status"] == "completed"


async def test_racing_answers_one_wins_the_others_409(api: Api, transport: PostgresTransport) -> None:
    _eid, iid = await _ask(api, transport)
    headers = [await _token(api, f"op{n}", Role.operator) for n in range(5)]
    responses = await asyncio.gather(*(
        api.client.post(f"/api/v1/inquiries/{iid}/respond", json={"data": n}, headers=h) for n, h in enumerate(headers)
    ))  # fmt: skip
    assert sorted(r.status_code for r in responses) == [200, 409, 409, 409, 409], [r.text for r in responses]
    assert (await api.one("SELECT count(*)::int AS n FROM inquiry_response"))["n"] == 1


async def test_not_found(api: Api) -> None:
    for path in ("/api/v1/inquiries/424242", "/api/v1/inquiries/0", f"/api/v1/inquiries/{2**63}"):
        response = await api.get(path)
        assert response.status_code in (404, 422), (path, response.text)
    assert error_of(await api.get("/api/v1/inquiries/424242"), 404) == (
        "no inquiry with id 424242 (see `conveyor inquiries list`)")  # fmt: skip
    response = await api.post("/api/v1/inquiries/424242/respond", json={"data": 1})
    assert error_of(response, 404).startswith("no inquiry with id 424242")
    assert (await api.get("/api/v1/inquiries", params={"status": "bogus"})).status_code == 422


async def test_cancel_through_the_api_cancels_the_inquiry(api: Api, transport: PostgresTransport) -> None:
    eid, iid = await _ask(api, transport)
    response = await api.post(f"/api/v1/executions/{eid}/cancel")
    assert response.json() == {"id": eid, "status": "cancelled"}
    assert (await api.get(f"/api/v1/inquiries/{iid}")).json()["status"] == "cancelled"
    late = await api.post(f"/api/v1/inquiries/{iid}/respond", json={"data": 1})
    assert error_of(late, 409) == f"inquiry {iid} is cancelled: it takes no more answers"
