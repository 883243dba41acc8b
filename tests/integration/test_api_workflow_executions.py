"""Integration: a workflow execution through the REST API in-process: its task tree and
children, pause and resume, cancel with a policy, rerun from the failed tasks, and the
refusals (404 unknown, 409 wrong state). The workflow is started by a real scheduling
round; its task rows are set up with SQL as the executor's advancement leaves them."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import Api, error_of, request, status_of
from integration.builders import scheduler

SOURCE = """
ref: tests.fan
tasks:
  prepare:
    action: core.noop
    next: [{when: <% succeeded() %>, do: each}]
  each:
    with: x in <% range(3) %>
    action: core.echo message=<% item(x) %>
"""


async def started(api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> int:
    """tests.fan registered, requested and started (running, with its workflow_execution)."""
    assert (await api.post("/api/v1/workflows", json={"source": SOURCE})).status_code == 201
    eid = await request(api, "tests.fan", {})
    await scheduler(pool, transport, "ex-test").run_round()
    assert await status_of(api, eid) == "running"
    return eid


async def child(api: Api, wf: int, parent: int, task: str, index: int | None, status: str, result: Any) -> int:
    """A child execution of ``task`` (item ``index``), ended ``status`` unless running."""
    eid = (await api.one("SELECT request_execution('core.echo', '{\"message\": \"m\"}', %s) AS id", (parent,)))["id"]
    if status != "running":  # along the status graph, as the guard requires
        await api.sql("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = %s", (eid,))
        await api.sql("UPDATE execution SET status = 'running', started = now(), attempt = 1 WHERE id = %s", (eid,))
        await api.sql("UPDATE execution SET status = %s, result = %s, ended = now() WHERE id = %s",
                      ("completed" if status == "succeeded" else "failed", Jsonb(result), eid))  # fmt: skip
    await api.sql(
        "INSERT INTO workflow_task_dispatch (workflow_execution, task_name, task_index, execution, status, retry)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (wf, task, index, eid, status, 1 if status == "failed" else 0),
    )
    return int(eid)


async def advanced(api: Api, eid: int) -> dict[str, int]:
    """prepare succeeded, each running over 3 items: 0 succeeded, 1 failed, 2 running."""
    wf = (await api.one("SELECT id FROM workflow_execution WHERE execution = %s", (eid,)))["id"]
    await api.sql("INSERT INTO workflow_task (workflow_execution, task_name, status, result) VALUES"
                  " (%s, 'prepare', 'succeeded', 'null'), (%s, 'each', 'running', NULL)", (wf, wf))  # fmt: skip
    await api.sql("UPDATE workflow_task SET items_total = 3, created = created + interval '1 s'"
                  " WHERE workflow_execution = %s AND task_name = 'each'", (wf,))  # fmt: skip
    ids = {"prepare": await child(api, wf, eid, "prepare", None, "succeeded", {"succeeded": True, "data": "ready"})}
    ids["0"] = await child(api, wf, eid, "each", 0, "succeeded", {"succeeded": True, "data": {"n": 0}})
    ids["1"] = await child(api, wf, eid, "each", 1, "failed", {"succeeded": False, "error": "boom"})
    ids["2"] = await child(api, wf, eid, "each", 2, "running", None)
    return ids


async def test_the_tree_and_the_children(
    api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    eid = await started(api, pool, transport)
    ids = await advanced(api, eid)
    response = await api.get(f"/api/v1/executions/{eid}/tree")
    assert response.status_code == 200, response.text
    tree = response.json()
    assert (tree["execution"], tree["workflow_ref"], tree["version"], tree["status"]) == (
        eid,
        "tests.fan",
        1,
        "running",
    )
    assert [(t["task"], t["status"], t["items_total"]) for t in tree["tasks"]] == [
        ("prepare", "succeeded", None), ("each", "running", 3)
    ]  # fmt: skip
    prepare, each = tree["tasks"]
    assert [(c["index"], c["execution"], c["execution_status"], c["result"]) for c in prepare["children"]] == [
        (None, ids["prepare"], "completed", '"ready"')
    ]
    assert [(c["index"], c["status"], c["retry"], c["result"]) for c in each["children"]] == [
        (0, "succeeded", 0, '{"n": 0}'), (1, "failed", 1, "boom"), (2, "running", 0, None)
    ]  # fmt: skip
    assert each["counts"] == {"succeeded": 1, "failed": 1, "running": 1}

    cut = (await api.get(f"/api/v1/executions/{eid}/tree", params={"items": 1})).json()["tasks"][1]
    assert ([c["index"] for c in cut["children"]], cut["children_total"]) == ([0], 3)

    children = (await api.get(f"/api/v1/executions/{eid}/children")).json()
    assert [c["id"] for c in children] == sorted(ids.values())
    assert {c["parent"] for c in children} == {eid}
    page = (await api.get(f"/api/v1/executions/{eid}/children", params={"after": ids["0"], "limit": 1})).json()
    assert [c["id"] for c in page] == [ids["1"]]


async def test_tree_and_children_of_what_is_not_a_workflow(api: Api) -> None:
    plain = await request(api)
    assert "not a workflow execution" in error_of(await api.get(f"/api/v1/executions/{plain}/tree"), 404)
    assert (await api.get(f"/api/v1/executions/{plain}/children")).json() == []
    for path in ("tree", "children"):
        assert "no execution with id 999" in error_of(await api.get(f"/api/v1/executions/999/{path}"), 404)


async def test_pause_resume_and_their_refusals(
    api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    eid = await started(api, pool, transport)
    assert "operator" in error_of(await api.post(f"/api/v1/executions/{eid}/pause", role="viewer"), 403)
    assert (await api.post(f"/api/v1/executions/{eid}/pause")).json() == {"id": eid, "status": "paused"}
    assert await status_of(api, eid) == "paused"
    kinds = await api.sql("SELECT ev.kind, ev.payload FROM workflow_event ev JOIN workflow_execution w"
                          " ON w.id = ev.workflow_execution WHERE w.execution = %s ORDER BY ev.id", (eid,))  # fmt: skip
    assert kinds[-1] == {"kind": "pause", "payload": {"by": "test operator"}}
    # Asking again is no error (as for cancel): it is paused.
    assert (await api.post(f"/api/v1/executions/{eid}/pause")).json() == {"id": eid, "status": "paused"}
    assert (await api.post(f"/api/v1/executions/{eid}/resume")).json() == {"id": eid, "status": "running"}
    assert (await api.post(f"/api/v1/executions/{eid}/resume")).json() == {"id": eid, "status": "running"}
    plain = await request(api)
    message = error_of(await api.post(f"/api/v1/executions/{plain}/pause"), 409)
    assert message == f"execution {plain} is requested: only a running workflow execution can pause"
    await api.sql("UPDATE execution SET status = 'failed', ended = now() WHERE id = %s", (eid,))
    assert "is failed: only a paused workflow" in error_of(await api.post(f"/api/v1/executions/{eid}/resume"), 409)
    for verb in ("pause", "resume"):
        error_of(await api.post(f"/api/v1/executions/424242/{verb}"), 404)


async def test_cancel_with_a_policy(api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> None:
    eid = await started(api, pool, transport)
    response = await api.post(f"/api/v1/executions/{eid}/cancel", json={"policy": "cancel_running"})
    assert response.json() == {"id": eid, "status": "canceling"}, response.text
    event = await api.one(
        "SELECT ev.payload FROM workflow_event ev JOIN workflow_execution w"
        " ON w.id = ev.workflow_execution WHERE w.execution = %s AND ev.kind = 'cancel'",
        (eid,),
    )
    assert event["payload"]["policy"] == "cancel_running"
    assert "policy" in error_of(await api.post(f"/api/v1/executions/{eid}/cancel", json={"policy": "now"}), 422)
    plain = await request(api)  # no body, or no policy: as before
    assert (await api.post(f"/api/v1/executions/{plain}/cancel")).json() == {"id": plain, "status": "cancelled"}


async def test_rerun_from_failed(api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport) -> None:
    eid = await started(api, pool, transport)
    ids = await advanced(api, eid)
    body = {"from_failed": True}
    assert "is running" in error_of(await api.post(f"/api/v1/executions/{eid}/rerun", json=body), 409)
    await api.sql("UPDATE workflow_task SET status = 'failed' WHERE task_name = 'each'")
    await api.sql("UPDATE execution SET status = 'failed', ended = now() WHERE id = %s", (eid,))
    response = await api.post(f"/api/v1/executions/{eid}/rerun", json=body)
    assert response.status_code == 201, response.text
    new = response.json()
    assert (new["action_ref"], new["status"], new["parameters"]) == ("tests.fan", "requested", {})
    tree = (await api.get(f"/api/v1/executions/{new['id']}/tree")).json()
    assert tree["rerun_of"] == eid
    # Copied whole (the failed 'each' too): the rerun starts it again as a new iteration.
    assert [(t["task"], t["status"]) for t in tree["tasks"]] == [("prepare", "succeeded"), ("each", "failed")]
    assert tree["tasks"][0]["children"][0]["execution"] == ids["prepare"]
    plain = await request(api)
    assert "not a workflow execution" in error_of(await api.post(f"/api/v1/executions/{plain}/rerun", json=body), 404)
    error_of(await api.post("/api/v1/executions/424242/rerun", json=body), 404)
    # Without from_failed: a new execution with the same parameters, as for any action.
    again = await api.post(f"/api/v1/executions/{eid}/rerun")
    assert (again.status_code, again.json()["action_ref"], again.json()["status"]) == (201, "tests.fan", "requested")


# -- the dashboard ----------------------------------------------------------------------------


async def test_the_dashboard_draws_the_graph_with_live_states(
    api: Api, pool: AsyncConnectionPool[Any], transport: PostgresTransport
) -> None:
    eid = await started(api, pool, transport)
    before = await api.get(f"/_live/executions/{eid}")
    assert before.status_code == 200, before.text
    assert 'class="wf-task g-none" data-task="each"' in before.text  # nothing entered yet
    ids = await advanced(api, eid)
    for path in (f"/executions/{eid}", f"/_live/executions/{eid}"):
        page = await api.get(path)
        assert page.status_code == 200, page.text
        assert f'<a href="/executions/{ids["prepare"]}">' in page.text
        assert 'class="wf-task g-succeeded" data-task="prepare"' in page.text
        assert 'class="wf-task g-running" data-task="each"' in page.text
        assert "running · 2/3 items" in page.text  # two of three items ended
        assert 'data-from="prepare" data-to="each"' in page.text
        assert 'id="workflow-tasks"' in page.text
    plain = await api.get(f"/executions/{await request(api)}")
    assert plain.status_code == 200
    assert "wf-graph" not in plain.text

    listed = await api.get("/workflows")
    assert listed.status_code == 200
    assert 'data-workflow="tests.fan"' in listed.text
    shown = await api.get("/workflows/tests.fan")
    assert shown.status_code == 200
    assert shown.text.count('class="wf-task g-none"') == 2
    assert "with: x in &lt;% range(3) %&gt;" in shown.text  # the source, escaped
    assert (await api.get("/workflows/tests.nothing")).status_code == 404
