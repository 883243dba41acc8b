"""The dashboard's /policies and /actions pages (issue #15), over HTTP in-process: what
they show (slots held, the queue in order with positions, bounded; the workers offering
an action, its outcomes), user data escaped, controls for the roles the API accepts only
(and the API refusing the others), and the plans of dashboard_catalog.sql on 200k rows."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from markupsafe import escape
from psycopg.types.json import Jsonb

from conveyor.api.dashboard import catalog
from conveyor.store.queries import Q
from integration.api_kit import Api, error_of, make_worker, request
from integration.test_dashboard_actions import SCRIPT, failed

Conn = psycopg.Connection[dict[str, Any]]
POLICY = {"target": "core.echo", "concurrency": 1, "parameters": ["message"], "method": "enqueue"}


def escaped(value: str) -> str:
    return str(escape(value))  # as Jinja escapes it


def section(page: str, marker: str, end: str = "</section>") -> str:
    start = page.index(marker)
    return page[start : page.index(end, start)]


async def test_policies_show_holders_and_the_queue_in_order_escaped(api: Api) -> None:
    await api.sql(Q["set_policy"], POLICY)
    holder, first, second = [await request(api, parameters={"message": SCRIPT}) for _ in range(3)]
    other = await request(api, parameters={"message": "b"})
    for path in ["/policies", "/_live/policies"]:
        page = (await api.get(path, role="viewer")).text
        assert SCRIPT not in page
        mine = section(page, 'data-policy="core.echo"')
        assert f'<tr data-id="{holder}">' in section(mine, 'class="list slots"', "</table>")
        queue = section(mine, f'data-group="{escaped(json.dumps({"message": SCRIPT}))}"', "</table>")
        assert f'<tr data-id="{first}" data-position="1">' in queue
        assert f'<tr data-id="{second}" data-position="2">' in queue
        assert "2 waiting" in queue
        assert f'data-id="{other}"' in section(mine, 'class="list slots"', "</table>")  # its own group's slot


async def test_the_queue_shows_the_first_waiting_per_group_and_counts_the_rest(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog, "QUEUE_SHOWN", 2)
    await api.sql(Q["set_policy"], {**POLICY, "parameters": []})
    ids = [await request(api) for _ in range(5)]
    page = (await api.get("/policies")).text
    assert "4 waiting, the first 2 shown (2 more)" in page
    assert f'data-id="{ids[2]}" data-position="2"' in page
    assert f'data-id="{ids[3]}"' not in page


async def test_policy_controls_are_for_admins_and_the_api_refuses_the_others(api: Api) -> None:
    await api.sql(Q["set_policy"], {**POLICY, "parameters": ["<b>p</b>"]})
    for role in ["viewer", "operator"]:
        page = (await api.get("/policies", role=role)).text
        assert 'id="policy-form"' not in page
        assert "data-policy-delete" not in page
        assert f"needs the admin role; this token is {role}" in page
        assert "<b>p</b>" not in page
        assert escaped("<b>p</b>") in page
        put = await api.client.put("/api/v1/policies/core.noop", json={"concurrency": 1}, headers=api.auth(role))
        assert "admin role" in error_of(put, 403)
        assert "admin role" in error_of(await api.delete("/api/v1/policies/core.echo", role=role), 403)
    page = (await api.get("/policies", role="admin")).text
    assert 'id="policy-form"' in page
    assert 'data-policy-delete="core.echo"' in page
    assert "policies.js" in page


async def test_actions_show_their_schema_workers_and_outcomes_escaped(api: Api) -> None:
    worker = await make_worker(api, "w1")  # imports core.echo; offers the python runtime
    # live_workers: its liveness lock is not held here, so it must predate this server epoch
    await api.sql("UPDATE worker SET lock_epoch = NULL WHERE id = %s", (worker,))
    schema = {"type": "object", "properties": {"x": {"type": "string", "description": SCRIPT}}}
    await api.sql(
        "INSERT INTO action (ref, pack, name, description, runner_type, runtime, parameters_schema) VALUES"
        " ('tst.shell', 'tst', 'shell', %s, 'subprocess', 'python', %s),"
        " ('tst.lonely', 'tst', 'lonely', '', 'python', 'python', '{}')",
        (SCRIPT, Jsonb(schema)),
    )
    done = await failed(api, worker, SCRIPT)
    listing = (await api.get("/actions")).text
    assert SCRIPT not in listing
    assert escaped(SCRIPT) in listing
    row = section(listing, '<tr data-ref="tst.shell">', "</tr>")
    assert "w1" in row  # through its runtime
    assert "no live worker" in section(listing, '<tr data-ref="tst.lonely">', "</tr>")
    assert "failed 1" in section(listing, '<tr data-ref="core.echo">', "</tr>")
    assert "Request…" not in listing  # a viewer

    page = (await api.get("/actions/tst.shell")).text
    assert SCRIPT not in page
    assert escaped(json.dumps(SCRIPT)[1:-1]) in section(page, 'id="action-schema"', "</pre>")
    assert '<tr data-worker="w1">' in page
    echo = (await api.get("/_live/actions/core.echo")).text
    assert f'<tr data-id="{done}" data-status="failed">' in echo
    assert escaped(SCRIPT) in section(echo, f'<tr data-id="{done}"', "</tr>")
    assert 'data-status="failed">failed 1' in echo
    assert (await api.get("/actions/tst.nothing")).status_code == 404

    operator = (await api.get("/actions/core.echo", role="operator")).text
    assert 'href="/executions?request=core.echo#request-form"' in operator
    form = (await api.get("/executions?request=core.echo", role="operator")).text
    assert '<option value="core.echo" selected>' in form
    refused = await api.post("/api/v1/executions", role="viewer", json={"action_ref": "core.echo"})
    assert "operator role" in error_of(refused, 403)


# -- plans ----------------------------------------------------------------------------------


def plan_of(conn: Conn, query: str, params: dict[str, Any]) -> dict[str, Any]:
    row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + Q[query], params).fetchone()
    assert row is not None
    return dict(row["QUERY PLAN"][0]["Plan"])


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


def test_the_action_queries_read_ranges_of_the_action_index_not_the_history(conn: Conn) -> None:
    """200k executions of core.echo two days old, 30 of this hour: the counts and the recent
    list read index ranges (no sequential scan of execution), a few buffers."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")  # past the guard trigger's now()
        conn.execute(
            "INSERT INTO execution (action_ref, status, created, updated) "
            "SELECT 'core.echo', 'completed', now() - interval '2 days', now() - interval '2 days' "
            "FROM generate_series(1, 200000) UNION ALL "
            "SELECT 'core.echo', 'failed', now(), now() FROM generate_series(1, 30)"
        )
    conn.execute("ANALYZE execution")
    for query, params in [("dash_action_counts", {}), ("dash_action_hour", {"ref": "core.echo"}),
                          ("dash_action_recent", {"ref": "core.echo", "limit": 20})]:  # fmt: skip
        plan = plan_of(conn, query, params)
        scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes(plan)]
        assert not [s for s in scans if s[0] == "Seq Scan" and s[1] == "execution"], (query, scans)
        # (action_ref, created), or for the counts of every action (created): a range either way
        assert any(s[2] in ("execution_action_idx", "execution_created_idx") for s in scans), (query, scans)
        buffers = int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
        assert buffers < 200, (query, buffers)  # the whole table is over 1,500 pages
    counts = conn.execute(Q["dash_action_hour"], {"ref": "core.echo"}).fetchall()
    assert counts == [{"status": "failed", "n": 30}]
    recent = conn.execute(Q["dash_action_recent"], {"ref": "core.echo", "limit": 20}).fetchall()
    assert [r["status"] for r in recent] == ["failed"] * 20


def test_the_queue_query_numbers_each_group_and_bounds_it(conn: Conn) -> None:
    conn.execute(Q["set_policy"], POLICY)
    for i in range(7):
        conn.execute("SELECT request_execution('core.echo', %s)", (Jsonb({"message": str(i % 2)}),))
    rows = conn.execute(Q["dash_policy_queue"], {"groups": 10, "per_group": 2}).fetchall()
    zero, one = {"message": "0"}, {"message": "1"}
    assert [(r["group_key"], r["position"], r["waiting"]) for r in rows] == [
        (zero, 1, 3), (zero, 2, 3), (one, 1, 2), (one, 2, 2)]  # fmt: skip
    assert [r["group_key"] for r in conn.execute(Q["dash_policy_queue"], {"groups": 1, "per_group": 5})] == [
        {"message": "0"}] * 3  # fmt: skip
    slots = conn.execute(Q["dash_policy_slots"], {"limit": 10}).fetchall()
    assert [(s["group_key"], s["status"]) for s in slots] == [
        ({"message": "0"}, "requested"),
        ({"message": "1"}, "requested"),
    ]
