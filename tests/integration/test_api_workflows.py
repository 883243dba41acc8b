"""Integration: ``/api/v1/workflows`` in-process against the per-test database: register
(YAML text or a JSON document; every problem answered with its path, nothing stored),
versions, the graph, list, delete, and who may."""

from __future__ import annotations

from integration.api_kit import Api, error_of

HELLO = """
ref: tests.hello
description: Say hello, then bye
input: [name]
tasks:
  hello:
    action: core.echo message="hello <% ctx(name) %>"
    next:
      - when: <% succeeded() %>
        do: bye
  bye:
    action: core.echo
    input: {message: bye}
output:
  - said: <% ctx(name) %>
"""

BROKEN = """
ref: tests.broken
tasks:
  first:
    action: nope.nothing
    next:
      - do: [missing]
  orphan:
    action: core.noop
    input: {x: <% ctx( %>}
"""


async def test_register_get_versions_and_the_graph(api: Api) -> None:
    response = await api.post("/api/v1/workflows", json={"source": HELLO})
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["ref"], body["version"], body["description"]) == ("tests.hello", 1, "Say hello, then bye")
    assert body["source"] == HELLO
    assert [n["name"] for n in body["graph"]["nodes"]] == ["hello", "bye"]
    assert [n["start"] for n in body["graph"]["nodes"]] == [True, False]
    assert body["graph"]["edges"] == [{"from": "hello", "to": "bye", "when": "<% succeeded() %>"}]
    action = await api.one("SELECT runner_type, parameters_schema FROM action WHERE ref = 'tests.hello'")
    assert action["runner_type"] == "workflow"
    assert "name" in action["parameters_schema"]["properties"]

    again = await api.post("/api/v1/workflows", json={"source": HELLO.replace("then bye", "then leave")})
    assert again.status_code == 201, again.text
    assert again.json()["version"] == 2

    latest = (await api.get("/api/v1/workflows/tests.hello")).json()
    assert (latest["version"], latest["description"]) == (2, "Say hello, then leave")
    assert [(v["version"], v["running"]) for v in latest["versions"]] == [(1, 0), (2, 0)]
    first = (await api.get("/api/v1/workflows/tests.hello", params={"version": 1})).json()
    assert first["description"] == "Say hello, then bye"
    assert "no version 9 of workflow 'tests.hello'" in error_of(
        await api.get("/api/v1/workflows/tests.hello", params={"version": 9}), 404
    )
    assert "no workflow 'tests.nothing'" in error_of(await api.get("/api/v1/workflows/tests.nothing"), 404)

    listed = (await api.get("/api/v1/workflows")).json()
    assert [(w["ref"], w["version"], w["versions"], w["tasks"]) for w in listed] == [("tests.hello", 2, 2, 2)]


async def test_every_problem_is_answered_with_its_path_and_nothing_is_stored(api: Api) -> None:
    response = await api.post("/api/v1/workflows", json={"source": BROKEN})
    error_of(response, 422)
    problems = response.json()["problems"]
    assert all(set(p) == {"path", "message"} for p in problems), problems
    paths = {p["path"] for p in problems}
    assert "tasks.first.action" in paths, problems  # unknown action
    assert any(p.startswith("tasks.first.next[0].do") for p in paths), problems  # unknown task
    assert any(p.startswith("tasks.orphan") for p in paths), problems  # unreachable, bad expression
    assert await api.sql("SELECT ref FROM workflow_definition") == []
    assert await api.sql("SELECT ref FROM action WHERE runner_type = 'workflow'") == []


async def test_yaml_that_does_not_parse_is_a_422_with_where(api: Api) -> None:
    response = await api.post("/api/v1/workflows", json={"source": "ref: a.b\ntasks: [unclosed"})
    message = error_of(response, 422)
    assert "invalid workflow definition" in message
    assert response.json()["problems"], response.json()


async def test_a_json_document_and_a_ref_given_apart(api: Api) -> None:
    document = {"tasks": {"only": {"action": "core.noop"}}}
    response = await api.post("/api/v1/workflows", json={"definition": document, "ref": "tests.json"})
    assert response.status_code == 201, response.text
    assert response.json()["ref"] == "tests.json"
    assert response.json()["graph"]["nodes"][0]["name"] == "only"


async def test_source_xor_definition(api: Api) -> None:
    for body in ({}, {"source": HELLO, "definition": {"tasks": {}}}, {"ref": "a.b"}):
        assert "either source" in error_of(await api.post("/api/v1/workflows", json=body), 422)


async def test_a_workflow_cannot_replace_an_action_of_a_worker(api: Api) -> None:
    source = "ref: core.noop\ntasks:\n  a:\n    action: core.echo message=x\n"
    assert "runner type" in error_of(await api.post("/api/v1/workflows", json={"source": source}), 409)


async def test_delete_then_gone_and_a_viewer_may_only_read(api: Api) -> None:
    assert "operator" in error_of(await api.post("/api/v1/workflows", role="viewer", json={"source": HELLO}), 403)
    assert (await api.post("/api/v1/workflows", json={"source": HELLO})).status_code == 201
    assert (await api.post("/api/v1/workflows", json={"source": HELLO})).status_code == 201
    assert "admin" in error_of(await api.delete("/api/v1/workflows/tests.hello", role="operator"), 403)
    deleted = await api.delete("/api/v1/workflows/tests.hello")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"ref": "tests.hello", "versions": 2}
    error_of(await api.get("/api/v1/workflows/tests.hello"), 404)
    error_of(await api.delete("/api/v1/workflows/tests.hello"), 404)
    assert (await api.get("/api/v1/workflows")).json() == []
    # A deleted workflow is no action a new definition may name.
    uses = "ref: tests.uses\ntasks:\n  a:\n    action: tests.hello\n"
    response = await api.post("/api/v1/workflows", json={"source": uses})
    assert any("tests.hello" in p["message"] for p in response.json()["problems"]), response.text
