"""Integration: the operator interfaces of admission policies (SDK, REST API, ``policy=``
on action definitions) against the real database. How admission itself behaves (limits,
FIFO, release) is tested in test_admission.py; here: what operators set, see and are
refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conveyor.actions.registry import ActionDefinition, ActionRegistry, AdmissionPolicy
from conveyor.domain.errors import ConflictError, InvalidPolicyError, NotFoundError
from conveyor.sdk import Client
from conveyor.store.queries import Q
from conveyor.store.rows import action_row
from integration.api_kit import Api, error_of, request

Conn = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def client(db_url: str) -> Iterator[Client]:
    with Client(db_url) as c:
        yield c


def register(conn: Conn, definition: ActionDefinition) -> None:
    """What a worker does at start for each action it offers."""
    conn.execute(Q["upsert_action"], action_row(definition))


def echo_with(policy: Any, ref: str = "shop.mail") -> ActionDefinition:
    """A fresh registry's definition of ``ref`` declaring ``policy``."""
    registry = ActionRegistry()

    @registry.action(ref, policy=policy)
    def mail(host: str, message: str = "") -> None:
        pass

    definition = registry.get(ref)
    assert definition is not None
    return definition


def shown(policy: dict[str, Any]) -> tuple[Any, ...]:
    return (policy["target"], policy["scope"], policy["concurrency"], policy["parameters"], policy["method"],
            policy["source"])  # fmt: skip


# -- the SDK -------------------------------------------------------------------------------------


def test_set_list_get_replace_and_delete(client: Client) -> None:
    assert client.policies() == []
    created = client.set_policy("*", 10, method="cancel")
    assert shown(created) == ("*", "global", 10, [], "cancel", "operator")
    assert (created["held"], created["waiting"]) == (0, 0)
    client.set_policy("core", 4)
    client.set_policy("core.echo", 2, ["message"])
    assert [shown(p) for p in client.policies()] == [  # most specific first
        ("core.echo", "action", 2, ["message"], "enqueue", "operator"),
        ("core", "pack", 4, [], "enqueue", "operator"),
        ("*", "global", 10, [], "cancel", "operator"),
    ]

    replaced = client.set_policy("core.echo", 3, method="cancel")
    assert shown(replaced) == ("core.echo", "action", 3, [], "cancel", "operator")
    assert replaced["updated"] >= created["updated"]
    assert shown(client.policy("core.echo")) == shown(replaced)

    deleted = client.delete_policy("core")
    assert (deleted["target"], deleted["source"], deleted["released"], deleted["restored"]) == ("core", "operator", 0,
                                                                                                None)  # fmt: skip
    with pytest.raises(NotFoundError, match="no admission policy for 'core'"):
        client.policy("core")
    with pytest.raises(NotFoundError, match="no admission policy for 'core'"):
        client.delete_policy("core")
    assert [p["target"] for p in client.policies()] == ["core.echo", "*"]


@pytest.mark.parametrize(
    ("target", "concurrency", "parameters", "method", "message"),
    [
        ("", 1, (), "enqueue", "invalid policy target ''"),
        ("core echo", 1, (), "enqueue", "invalid policy target 'core echo'"),
        ("core.", 1, (), "enqueue", "invalid policy target"),
        (".echo", 1, (), "enqueue", "invalid policy target"),
        ("**", 1, (), "enqueue", "invalid policy target"),
        ("core.echo\n", 1, (), "enqueue", "invalid policy target"),
        ("a" * 256, 1, (), "enqueue", "invalid policy target"),
        ("core.echo", 0, (), "enqueue", "concurrency must be between 1 and 2147483647, not 0"),
        ("core.echo", -3, (), "enqueue", "concurrency must be between 1"),
        ("core.echo", 2**31, (), "enqueue", "concurrency must be between 1"),
        ("core.echo", True, (), "enqueue", "concurrency must be a whole number"),
        ("core.echo", 1.5, (), "enqueue", "concurrency must be a whole number"),
        ("core.echo", "2", (), "enqueue", "concurrency must be a whole number"),
        ("core.echo", 1, ("",), "enqueue", "parameter names must be non-empty strings"),
        ("core.echo", 1, ("nul\x00",), "enqueue", "parameter names must be non-empty strings"),
        ("core.echo", 1, ("\ud800",), "enqueue", "parameter names must be non-empty strings"),
        ("core.echo", 1, (7,), "enqueue", "parameter names must be non-empty strings"),
        ("core.echo", 1, ("host", "host"), "enqueue", "parameter names are repeated"),
        ("core.echo", 1, "host", "enqueue", "parameters must be a list of parameter names"),
        ("core.echo", 1, (), "queue", "method must be 'enqueue' or 'cancel', not 'queue'"),
    ],
)
def test_invalid_policies_are_refused_saying_why(
    client: Client, target: str, concurrency: Any, parameters: Any, method: str, message: str
) -> None:
    with pytest.raises(InvalidPolicyError, match=message.replace("*", r"\*")):
        client.set_policy(target, concurrency, parameters, method)
    assert client.policies() == []


def test_unknown_and_impossible_targets_are_not_found(client: Client) -> None:
    for target in ("core.nothing", "nope", "*", "not a target", "x" * 1000):
        with pytest.raises(NotFoundError, match="no admission policy"):
            client.policy(target)
        with pytest.raises(NotFoundError, match="no admission policy"):
            client.delete_policy(target)


def test_where_an_execution_stands_and_what_set_and_delete_release(client: Client) -> None:
    client.set_policy("core.echo", 1, ["message"])
    first, second, third = (client.request("core.echo", {"message": "a"}) for _ in range(3))
    other = client.request("core.echo", {"message": "b"})  # its own group: admitted at once
    unpoliced = client.request("core.noop")

    holding = client.admission(first)
    assert holding is not None
    assert (holding["state"], holding["policy"], holding["group_key"], holding["ahead"]) == (
        "holding", "core.echo", {"message": "a"}, 0)  # fmt: skip
    waiting = client.admission(third)
    assert waiting is not None
    assert (waiting["state"], waiting["group_key"], waiting["ahead"]) == ("waiting", {"message": "a"}, 1)
    assert client.admission(other) is not None
    assert client.admission(other)["state"] == "holding"  # type: ignore[index]
    assert client.admission(unpoliced) is None
    assert (client.policy("core.echo")["held"], client.policy("core.echo")["waiting"]) == (2, 2)

    # A higher limit admits the next in line at once.
    client.set_policy("core.echo", 2, ["message"])
    assert client.admission(second)["state"] == "holding"  # type: ignore[index]
    assert client.admission(third) == {**waiting, "ahead": 0}

    # Deleting it lets its waiters go: no admission any more, still to be scheduled.
    assert client.delete_policy("core.echo")["released"] == 1
    assert client.admission(third) is None
    assert client.get(third).status == "requested"


# -- policy= on action definitions ------------------------------------------------------------


def test_policy_on_a_definition_is_stored_as_json_and_checked_at_once() -> None:
    assert echo_with(AdmissionPolicy(2, ("host",))).metadata["policy"] == {
        "concurrency": 2, "parameters": ["host"], "method": "enqueue"}  # fmt: skip
    assert echo_with({"concurrency": 1, "method": "cancel"}).metadata["policy"] == {
        "concurrency": 1, "parameters": [], "method": "cancel"}  # fmt: skip
    assert "policy" not in echo_with(None).metadata

    registry = ActionRegistry()
    command = registry.subprocess_action("shop.report", argv=["true"], policy={"concurrency": 3, "parameters": ["a"]})
    assert command.metadata["policy"] == {"concurrency": 3, "parameters": ["a"], "method": "enqueue"}

    bad: list[tuple[Any, str]] = [
        ({"concurrency": 0}, "concurrency must be between 1"),
        ({"parameters": ["host"]}, "policy needs concurrency"),
        ({"concurrency": 2, "per": ["host"]}, r"unknown policy settings: \['per'\]"),
        ({"concurrency": 2, "parameters": "host"}, "parameters must be a list"),
        ({"concurrency": 2, "method": "drop"}, "method must be 'enqueue' or 'cancel'"),
        (3, "policy must be an AdmissionPolicy or a mapping, not int"),
    ]
    for policy, message in bad:
        with pytest.raises(ValueError, match=message):  # at definition, before any function is decorated
            registry.action("shop.bad", policy=policy)
        with pytest.raises(ValueError, match=message):
            registry.subprocess_action("shop.bad", argv=["true"], policy=policy)
    with pytest.raises(ValueError, match="parameter names are repeated"):
        AdmissionPolicy(1, ("a", "a"))


def test_a_definitions_policy_appears_and_an_operator_override_survives_registration(
    conn: Conn, client: Client
) -> None:
    register(conn, echo_with({"concurrency": 2, "parameters": ["host"]}))
    assert shown(client.policy("shop.mail")) == ("shop.mail", "action", 2, ["host"], "enqueue", "metadata")
    with pytest.raises(ConflictError, match="comes from the action's definition"):
        client.delete_policy("shop.mail")

    client.set_policy("shop.mail", 5)
    register(conn, echo_with({"concurrency": 3, "parameters": ["host"]}))  # a new version of the definition
    assert shown(client.policy("shop.mail")) == ("shop.mail", "action", 5, [], "enqueue", "operator")

    # Deleting the override puts the definition's policy (its latest version) back.
    deleted = client.delete_policy("shop.mail")
    assert deleted["source"] == "operator"
    assert shown(deleted["restored"]) == ("shop.mail", "action", 3, ["host"], "enqueue", "metadata")
    assert shown(client.policy("shop.mail")) == shown(deleted["restored"])

    # A definition without a policy takes its policy away; an operator's stays.
    register(conn, echo_with(None))
    with pytest.raises(NotFoundError):
        client.policy("shop.mail")
    client.set_policy("shop.mail", 1)
    register(conn, echo_with({"concurrency": 9}))
    assert shown(client.policy("shop.mail")) == ("shop.mail", "action", 1, [], "enqueue", "operator")
    register(conn, echo_with(None))
    assert client.policy("shop.mail")["source"] == "operator"
    assert client.delete_policy("shop.mail")["restored"] is None  # the definition has none now


# -- the REST API --------------------------------------------------------------------------------


async def put(api: Api, target: str, body: Any, role: str = "admin") -> Any:
    """``body``: JSON, or a str sent as it is (for what json= cannot encode)."""
    sent = {"content": body} if isinstance(body, str) else {"json": body}
    return await api.client.put(f"/api/v1/policies/{target}", headers=api.auth(role), **sent)


async def test_api_set_list_get_delete(api: Api) -> None:
    response = await put(api, "core.echo", {"concurrency": 1, "parameters": ["message"]})
    assert response.status_code == 200, response.text
    assert shown(response.json()) == ("core.echo", "action", 1, ["message"], "enqueue", "operator")
    assert (await put(api, "*", {"concurrency": 7, "method": "cancel"})).status_code == 200

    listed = await api.get("/api/v1/policies")
    assert listed.status_code == 200, listed.text
    assert [(p["target"], p["scope"], p["held"], p["waiting"]) for p in listed.json()] == [
        ("core.echo", "action", 0, 0), ("*", "global", 0, 0)]  # fmt: skip
    got = await api.get("/api/v1/policies/*")
    assert shown(got.json()) == ("*", "global", 7, [], "cancel", "operator")

    # The execution detail says where an execution stands.
    first, second = await request(api), await request(api)
    detail = (await api.get(f"/api/v1/executions/{second}")).json()
    assert {k: detail["admission"][k] for k in ("state", "policy", "group_key", "ahead")} == {
        "state": "waiting", "policy": "core.echo", "group_key": {"message": "hi"}, "ahead": 0}  # fmt: skip
    assert (await api.get(f"/api/v1/executions/{first}")).json()["admission"]["state"] == "holding"
    created = await api.post("/api/v1/executions", json={"action_ref": "core.echo", "parameters": {"message": "hi"}})
    assert created.json()["admission"]["ahead"] == 1
    assert (await api.get("/api/v1/policies/core.echo")).json()["waiting"] == 2

    deleted = await api.delete("/api/v1/policies/core.echo")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"target": "core.echo", "source": "operator", "released": 2, "restored": None}
    assert (await api.get(f"/api/v1/executions/{second}")).json()["admission"] is None
    assert "no admission policy for 'core.echo'" in error_of(await api.get("/api/v1/policies/core.echo"), 404)
    error_of(await api.delete("/api/v1/policies/core.echo"), 404)


async def test_api_refuses_invalid_policies_with_422_saying_why(api: Api) -> None:
    cases: list[tuple[str, Any, str]] = [
        ("core echo", {"concurrency": 1}, "invalid policy target 'core echo'"),
        ("a" * 300, {"concurrency": 1}, "invalid policy target"),
        ("core.echo", {"concurrency": 0}, "concurrency"),
        ("core.echo", {"concurrency": 2**31}, "concurrency"),
        ("core.echo", {"concurrency": "many"}, "concurrency"),
        ("core.echo", {"concurrency": True}, "concurrency: Input should be a valid integer"),
        ("core.echo", {"concurrency": 1.0}, "concurrency: Input should be a valid integer"),
        ("core.echo", {}, "concurrency: Field required"),
        ("core.echo", {"concurrency": 1, "method": "drop"}, "method"),
        ("core.echo", {"concurrency": 1, "parameters": ["a", "a"]}, "parameter names are repeated"),
        ("core.echo", {"concurrency": 1, "parameters": [""]}, "parameter names must be non-empty"),
        ("core.echo", {"concurrency": 1, "parameters": ["nul\x00"]}, "parameter names must be non-empty"),
        ("core.echo", '{"concurrency": 1, "parameters": ["\\ud800"]}', "parameter names must be non-empty"),
        ("core.echo", {"concurrency": 1, "parameters": "host"}, "parameters"),
        ("core.echo", {"concurrency": 1, "per": "host"}, "per: Extra inputs are not permitted"),
    ]
    for target, body, message in cases:
        assert message in error_of(await put(api, target, body), 422), (target, body)
    for target in ("core echo", "x" * 300):
        error_of(await api.get(f"/api/v1/policies/{target}"), 404)
    assert await api.sql("SELECT target FROM admission_policy") == []


async def test_api_roles_viewers_read_admins_manage(api: Api) -> None:
    assert (await put(api, "core", {"concurrency": 2})).status_code == 200
    for path in ("/api/v1/policies", "/api/v1/policies/core"):
        assert "missing token" in error_of(await api.client.get(path), 401)
        assert (await api.get(path, role="viewer")).status_code == 200
    assert "missing token" in error_of(await api.client.put("/api/v1/policies/core", json={"concurrency": 1}), 401)
    assert "missing token" in error_of(await api.client.delete("/api/v1/policies/core"), 401)
    for role in ("viewer", "operator"):
        assert f"needs the admin role; token 'test {role}' is {role}" in error_of(
            await put(api, "core", {"concurrency": 1}, role=role), 403)  # fmt: skip
        error_of(await api.delete("/api/v1/policies/core", role=role), 403)
    assert (await api.get("/api/v1/policies/core")).json()["concurrency"] == 2


async def test_api_delete_of_a_definitions_policy_is_409_and_of_an_override_restores_it(api: Api) -> None:
    async with api.pool.connection() as conn:
        await conn.execute(Q["upsert_action"], action_row(echo_with({"concurrency": 2, "method": "cancel"})))
    assert "comes from the action's definition" in error_of(await api.delete("/api/v1/policies/shop.mail"), 409)
    assert (await put(api, "shop.mail", {"concurrency": 4})).json()["source"] == "operator"
    deleted = (await api.delete("/api/v1/policies/shop.mail")).json()
    assert shown(deleted["restored"]) == ("shop.mail", "action", 2, [], "cancel", "metadata")
