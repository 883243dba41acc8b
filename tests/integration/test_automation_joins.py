"""The automation pieces joined, end to end against real PostgreSQL with the real
executor service running in-process (its event pass, slot loop and scheduler): a signed
GitHub-style delivery through the webhook door to a rule that tests the body and the
``x-github-event`` header to one execution with rendered parameters; a schedule with no
action emitting events to a rule; a rule requesting a workflow from a webhook."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.executor.service import ExecutorService
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import Api
from integration.webhook_kit import post, register, signed
from support.polling import until

PUSH = {"ref": "refs/heads/main", "after": "abc123", "pusher": {"name": "ann"}}
RULE = {
    "ref": "ci.deploy_main",
    "trigger": "github",
    "criteria": {
        "trigger.body.ref": {"type": "equals", "pattern": "refs/heads/main"},
        "trigger.headers['x-github-event']": {"type": "equals", "pattern": "push"},
    },
    "action": {
        "ref": "core.echo",
        "parameters": {"message": "{{ trigger.body.after }} by <% $.trigger.body.pusher.name %>"},
    },
}


@pytest.fixture
async def executor(db_url: str, pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> AsyncIterator[None]:
    service = ExecutorService(Settings(), db_url, pool, transport)
    stop, ready = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(transport.run(ready))
    await asyncio.wait_for(ready.wait(), 10)
    task = asyncio.create_task(service.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        listener.cancel()


async def enforced(api: Api, rule: str) -> list[dict[str, Any]]:
    return await api.sql(
        "SELECT f.*, x.action_ref AS x_action, x.parameters AS x_parameters, x.requested_by"
        " FROM enforcement f LEFT JOIN execution x ON x.id = f.execution WHERE f.rule_ref = %s ORDER BY f.id",
        (rule,),
    )


@pytest.mark.usefixtures("executor")
async def test_a_signed_delivery_runs_one_execution_with_rendered_parameters(api: Api) -> None:
    await register(api)
    assert (await api.post("/api/v1/rules", json=RULE)).status_code in (200, 201)
    kwargs = signed(PUSH, **{"X-GitHub-Delivery": "d-1"})
    first = await post(api, **kwargs)
    again = await post(api, **kwargs)  # the sender's retry: the same event
    other = await post(api, **signed(PUSH, **{"X-GitHub-Delivery": "d-2", "X-GitHub-Event": "ping"}))
    assert [r.status_code for r in (first, again, other)] == [202, 202, 202]
    assert again.json()["event_id"] == first.json()["event_id"]

    [f] = await until(lambda: enforced(api, "ci.deploy_main"), what="the push enforced")
    assert f["event"] == first.json()["event_id"]
    assert f["outcome"] == "requested"
    assert f["x_action"] == "core.echo"
    assert f["x_parameters"] == {"message": "abc123 by ann"}
    assert f["requested_by"] == "rule:ci.deploy_main"
    # The ping matched no rule: evaluated (not pending), nothing enforced, nothing requested.
    await until(lambda: _no_pending(api), what="every event evaluated")
    assert len(await enforced(api, "ci.deploy_main")) == 1
    assert (await api.one("SELECT count(*) AS n FROM execution"))["n"] == 1


async def _no_pending(api: Api) -> bool:
    return not await api.sql("SELECT 1 FROM event_pending")


@pytest.mark.usefixtures("executor")
async def test_a_schedule_without_an_action_feeds_a_rule(api: Api) -> None:
    created = await api.post("/api/v1/schedules", json={"name": "tick", "every": "1s"})
    assert created.status_code == 201, created.text
    rule = {"ref": "ops.on_tick", "trigger": "tick",
            "criteria": {"trigger.origin": {"type": "equals", "pattern": "scheduled"}},
            "action": {"ref": "core.echo",
                       "parameters": {"message": "slot {{ trigger.slot }} of {{ trigger.schedule }}"}}}  # fmt: skip
    assert (await api.post("/api/v1/rules", json=rule)).status_code in (200, 201)

    async def three() -> list[dict[str, Any]] | None:
        rows = await enforced(api, "ops.on_tick")
        return rows if len(rows) >= 3 else None

    rows = await until(three, what="three slots enforced")
    slots = await api.sql("SELECT slot, outcome, event, execution FROM schedule_slot ORDER BY slot")
    emitted = {s["event"] for s in slots if s["outcome"] == "emitted"}
    assert all(s["execution"] is None for s in slots)  # the slot names its event, the enforcement the execution
    for f in rows:
        assert f["outcome"] == "requested"
        assert f["event"] in emitted
        assert f["x_parameters"]["message"].startswith("slot ")
        assert f["x_parameters"]["message"].endswith(" of tick")
    assert len({f["event"] for f in rows}) == len(rows)  # one enforcement per event


WORKFLOW = """
ref: ci.release
input: [sha]
tasks:
  say:
    action: core.echo message=<% ctx(sha) %>
"""


@pytest.mark.usefixtures("executor")
async def test_a_rule_requests_a_workflow_from_a_webhook(api: Api) -> None:
    assert (await api.post("/api/v1/workflows", json={"source": WORKFLOW})).status_code == 201
    await register(api)
    rule = {
        **RULE,
        "ref": "ci.release_main",
        "action": {"ref": "ci.release", "parameters": {"sha": "{{ trigger.body.after }}"}},
    }
    assert (await api.post("/api/v1/rules", json=rule)).status_code in (200, 201)
    assert (await post(api, **signed(PUSH, **{"X-GitHub-Delivery": "d-9"}))).status_code == 202

    [f] = await until(lambda: enforced(api, "ci.release_main"), what="the push enforced")
    assert f["outcome"] == "requested", f
    assert f["x_action"] == "ci.release"
    assert f["x_parameters"] == {"sha": "abc123"}

    async def started() -> list[dict[str, Any]]:
        return await api.sql("SELECT * FROM workflow_execution WHERE execution = %s", (f["execution"],))

    await until(started, what="the workflow started by the scheduler")
    # The workflow's first task is requested as a child of the rule's execution.
    child = await until(lambda: api.sql("SELECT action_ref, parameters FROM execution WHERE parent = %s",
                                        (f["execution"],)), what="the workflow's task requested")  # fmt: skip
    assert child == [{"action_ref": "core.echo", "parameters": {"message": "abc123"}}]
