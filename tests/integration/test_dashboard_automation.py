"""The dashboard and the gauges know the automation statuses: ``pending`` (an inquiry
waiting) and ``paused`` (a workflow) are in the status filter, the overview counts and the
``conveyor_executions`` gauge; a workflow execution's page lists its children; a pending
core.ask execution's page links to its inquiry."""

from __future__ import annotations

from prometheus_client import REGISTRY

from conveyor.executor import gauges
from conveyor.transport.postgres import PostgresTransport
from integration.api_kit import Api, request, status_of
from integration.builders import scheduler

SOURCE = """
ref: tests.asking
tasks:
  ask:
    action: core.ask prompt="ship it?"
"""


async def paused_workflow_with_pending_child(api: Api, transport: PostgresTransport) -> tuple[int, int, int]:
    """tests.asking started and paused, with a core.ask child asked (pending): the
    (workflow execution, child, inquiry) ids. The child is requested with SQL as the
    advancement would request it (no executor runs here)."""
    assert (await api.post("/api/v1/workflows", json={"source": SOURCE})).status_code == 201
    wf = await request(api, "tests.asking", {})
    await scheduler(api.pool, transport, "ex-test").run_round()
    assert await status_of(api, wf) == "running"
    child = (await api.one("SELECT request_execution('core.ask', '{\"prompt\": \"ship it?\"}', %s) AS id", (wf,)))["id"]
    await scheduler(api.pool, transport, "ex-test").run_round()
    assert await status_of(api, child) == "pending"
    assert (await api.post(f"/api/v1/executions/{wf}/pause")).status_code == 200
    assert await status_of(api, wf) == "paused"
    inquiry = (await api.one("SELECT id FROM inquiry WHERE execution = %s", (child,)))["id"]
    return wf, int(child), int(inquiry)


async def test_pages_know_pending_and_paused(api: Api, transport: PostgresTransport) -> None:
    wf, child, inquiry = await paused_workflow_with_pending_child(api, transport)

    listing = await api.get("/executions")
    assert listing.status_code == 200
    assert "<option>pending</option>" in listing.text
    assert "<option>paused</option>" in listing.text
    for status, eid in (("pending", child), ("paused", wf)):
        filtered = await api.get(f"/executions?status={status}")
        assert filtered.status_code == 200, filtered.text
        assert f'data-id="{eid}" data-status="{status}"' in filtered.text

    overview = await api.get("/")
    assert overview.status_code == 200
    assert 'data-status="pending"' in overview.text
    assert 'data-status="paused"' in overview.text

    page = await api.get(f"/executions/{wf}")
    assert page.status_code == 200, page.text
    assert 'id="execution-children"' in page.text
    assert f'<tr data-id="{child}" data-status="pending">' in page.text
    assert f'<a href="/executions/{child}">{child}</a>' in page.text

    asking = await api.get(f"/executions/{child}")
    assert asking.status_code == 200
    assert f'<a href="/inquiries/{inquiry}" id="execution-inquiry">' in asking.text
    assert "waiting for an answer" in asking.text
    assert f'<a href="/executions/{wf}">{wf}</a>' in asking.text  # its parent
    plain = await api.get(f"/executions/{await request(api)}")
    assert "execution-inquiry" not in plain.text
    assert "execution-children" not in plain.text


async def test_the_executions_gauge_counts_pending_and_paused(api: Api, transport: PostgresTransport) -> None:
    await paused_workflow_with_pending_child(api, transport)
    gauges.GAUGES.clear()
    await gauges.refresh(api.pool)

    def value(status: str, action: str) -> float | None:
        return REGISTRY.get_sample_value("conveyor_executions", {"status": status, "action": action})

    assert value("pending", "core.ask") == 1
    assert value("paused", "tests.asking") == 1
    assert value("paused", "core.ask") == 0  # zeros are there for the new statuses too
    assert value("running", "tests.asking") == 0
