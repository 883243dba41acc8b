"""``/api/v1/rules`` in-process against the per-test database."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integration.api_kit import Api, error_of
from integration.rules.kit import run_pass

YAML = """
ref: ci.on_push
trigger: test.push
criteria: {trigger.branch: {type: equals, pattern: main}}
action: {ref: test.echo, parameters: {msg: "{{ trigger.branch }}"}}
"""


async def setup(api: Api) -> None:
    await api.sql("SELECT register_trigger('test.push', 'custom')")
    await api.sql("INSERT INTO action (ref, pack, name, runner_type, runtime) VALUES ('test.echo', 'test', 'echo', "
                  "'python', 'python')")  # fmt: skip


async def test_register_list_get_enable_disable_delete(api: Api) -> None:
    await setup(api)
    r = await api.post("/api/v1/rules", content=YAML, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert r.json()["ref"] == "ci.on_push"
    assert r.json()["created"] is True
    doc = {"ref": "ci.json", "trigger": "test.push", "action": {"ref": "test.echo", "parameters": {"msg": "x"}}}
    r = await api.post("/api/v1/rules", json=doc)
    assert r.status_code == 201, r.text
    r = await api.post("/api/v1/rules", json=doc)
    assert r.json()["created"] is False  # updated
    listed = (await api.get("/api/v1/rules")).json()
    assert [x["ref"] for x in listed] == ["ci.json", "ci.on_push"]
    await api.sql("SELECT emit_event('test.push', '{\"branch\": \"main\"}')")
    await run_pass(api.pool)
    got = (await api.get("/api/v1/rules/ci.on_push")).json()
    assert got["definition"]["ref"] == "ci.on_push"
    assert [f["outcome"] for f in got["recent"]] == ["requested"]
    assert got["recent"][0]["execution"]
    r = await api.post("/api/v1/rules/ci.on_push/disable")
    assert r.json() == {"ref": "ci.on_push", "enabled": False, "was": True}
    assert (await api.get("/api/v1/rules/ci.on_push")).json()["enabled"] is False
    r = await api.post("/api/v1/rules/ci.on_push/enable")
    assert r.json()["was"] is False
    assert (await api.delete("/api/v1/rules/ci.on_push", role="operator")).status_code == 204
    error_of(await api.get("/api/v1/rules/ci.on_push"), 404)
    error_of(await api.delete("/api/v1/rules/ci.on_push"), 404)
    error_of(await api.post("/api/v1/rules/nope/enable"), 404)


async def test_every_problem_with_its_path(api: Api) -> None:
    await setup(api)
    bad = {"ref": "a b", "trigger": "test.push", "criteria": {"trigger.x": {"type": "nope"}}, "action": {}}
    r = await api.post("/api/v1/rules", json=bad)
    error_of(r, 422)
    assert [p["path"] for p in r.json()["problems"]] == ["ref", "criteria.trigger.x.type", "action.ref"]
    assert "not YAML" in error_of(await api.post("/api/v1/rules", content=b"a: ["), 422)
    message = error_of(await api.post("/api/v1/rules", json={**json.loads(json.dumps(bad)), "ref": "a.b",
                                                              "criteria": {}, "action": {"ref": "x.y"},
                                                              "trigger": "nope"}), 404)  # fmt: skip
    assert "unknown trigger" in message
    error_of(await api.post("/api/v1/rules", role="viewer", json=bad), 403)
    assert await api.sql("SELECT * FROM rule") == []


async def test_a_name_with_a_final_newline_is_a_422_not_a_500(api: Api) -> None:
    await setup(api)
    for rule in ({"ref": "a.b\n", "trigger": "test.push", "action": {"ref": "core.noop"}},
                 {"ref": "a.b", "trigger": "test.push\n", "action": {"ref": "core.noop"}}):  # fmt: skip
        r = await api.post("/api/v1/rules", json=rule)
        error_of(r, 422)
        assert [p["path"] for p in r.json()["problems"]] in (["ref"], ["trigger"])
    assert await api.sql("SELECT * FROM rule") == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
async def test_any_body_is_a_4xx_or_a_rule(api: Api, body: bytes) -> None:
    r = await api.post("/api/v1/rules", content=body, headers={"Content-Type": "application/yaml"})
    assert r.status_code in (201, 404, 413, 422), r.text
