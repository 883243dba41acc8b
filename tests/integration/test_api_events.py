"""``/api/v1/triggers``, ``/api/v1/events``, ``/api/v1/enforcements`` (issue #13): register
(422 for a schema that is not JSON Schema), emit (202; 404 unknown trigger; 422 naming
each path; 409 a key reused with another payload; the Idempotency-Key header), list with
filters and a cursor, get with enforcements and replays, replay one or a window, delete
(409 in use); ``delay`` on ``POST /api/v1/executions``; and a fuzz of ``POST /events``:
never a 500, nothing half-stored."""

from __future__ import annotations

import asyncio
import json
import string
from typing import Any

import hypothesis
from hypothesis import HealthCheck
from hypothesis import strategies as st

from integration.api_kit import Api, error_of

SCHEMA = {"type": "object", "properties": {"service": {"type": "string"}, "replicas": {"type": "integer"}},
          "required": ["service"]}  # fmt: skip


async def _trigger(api: Api, name: str = "deploys", schema: Any = SCHEMA) -> None:
    response = await api.post("/api/v1/triggers", json={"name": name, "payload_schema": schema})
    assert response.status_code == 201, response.text


async def test_triggers(api: Api) -> None:
    await _trigger(api)
    assert (await api.get("/api/v1/triggers")).json()[0]["name"] == "deploys"
    again = await api.client.put("/api/v1/triggers/deploys", headers=api.auth("operator"),
                                 json={"payload_schema": None, "description": "any"})  # fmt: skip
    assert again.status_code == 200, again.text
    assert (again.json()["created_now"], again.json()["payload_schema"], again.json()["description"]) == (
        False, None, "any")  # fmt: skip
    bad = await api.post("/api/v1/triggers", json={"name": "x", "payload_schema": {"type": "nonsense"}})
    assert "is not a valid JSON Schema" in error_of(bad, 422)
    assert "invalid request" in error_of(await api.post("/api/v1/triggers", json={"name": "a b"}), 422)
    put = await api.client.put("/api/v1/triggers/a%20b", headers=api.auth("operator"), json={})
    assert "invalid trigger name" in error_of(put, 422)
    assert error_of(await api.get("/api/v1/triggers/nope"), 404).startswith("unknown trigger 'nope'")
    assert error_of(await api.post("/api/v1/triggers", role="viewer", json={"name": "v"}), 403)
    await api.sql("SELECT register_trigger('hook', 'webhook')")  # as a webhook registers its own
    assert "is a webhook trigger, not custom" in error_of(
        await api.post("/api/v1/triggers", json={"name": "hook"}), 409
    )
    await api.post("/api/v1/events", json={"trigger": "deploys"})
    assert "still in use" in error_of(await api.delete("/api/v1/triggers/deploys"), 409)
    await _trigger(api, "spare")
    assert error_of(await api.delete("/api/v1/triggers/spare", role="operator"), 403)
    assert (await api.delete("/api/v1/triggers/spare")).json() == {"deleted": "spare"}
    error_of(await api.delete("/api/v1/triggers/spare"), 404)


async def test_emit_list_get_replay(api: Api) -> None:
    await _trigger(api)
    first = await api.post("/api/v1/events", json={"trigger": "deploys", "payload": {"service": "api"}})
    assert first.status_code == 202, first.text
    eid = first.json()["id"]
    assert first.json() == {"id": eid, "repeated": False}
    error_of(await api.post("/api/v1/events", json={"trigger": "nope"}), 404)
    invalid = await api.post("/api/v1/events", json={"trigger": "deploys", "payload": {"replicas": "x"}})
    assert error_of(invalid, 422) == ("invalid payload for trigger deploys: payload: 'service' is a required "
                                      "property; payload.replicas: 'x' is not of type 'integer'")  # fmt: skip
    nul = await api.post("/api/v1/events", json={"trigger": "deploys", "payload": {"service": "a\x00b"}})
    assert "payload.service: contains a NUL character" in error_of(nul, 422)
    keyed = {"trigger": "deploys", "payload": {"service": "db"}}
    k1 = await api.post("/api/v1/events", json=keyed, headers={"Idempotency-Key": "k1"})
    k1_again = await api.post("/api/v1/events", json={**keyed, "idempotency_key": "k1"})
    assert k1_again.json() == {"id": k1.json()["id"], "repeated": True}
    reused = await api.post("/api/v1/events", json={**keyed, "payload": {"service": "x"}, "idempotency_key": "k1"})
    assert "already used for another event" in error_of(reused, 409)
    both = await api.post("/api/v1/events", json={**keyed, "idempotency_key": "k2"}, headers={"Idempotency-Key": "k3"})
    error_of(both, 409)
    error_of(await api.post("/api/v1/events", role="viewer", json=keyed), 403)

    page = (await api.get("/api/v1/events", params={"trigger": "deploys", "limit": 1})).json()
    assert [e["id"] for e in page["items"]] == [k1.json()["id"]]
    rest = (await api.get("/api/v1/events", params={"before": page["next_cursor"], "source": "api"})).json()
    assert [(e["id"], e["source"], e["pending"]) for e in rest["items"]] == [(eid, "api", True)]
    assert (await api.get("/api/v1/events", params={"trigger": "x\x00"})).json()["items"] == []
    error_of(await api.get("/api/v1/events", params={"since": "yesterday"}), 422)

    # An enforcement as the rules engine writes it, shown with its event.
    rule = await api.one("SELECT rule_id FROM register_rule('deploys.echo', 'deploys', '{}', 'core.echo', '{}')")
    made = await api.one("INSERT INTO enforcement (rule, rule_ref, event, outcome, error) VALUES (%s, 'deploys.echo',"
                         " %s, 'template_error', 'no such key') RETURNING id", (rule["rule_id"], eid))  # fmt: skip
    replayed = await api.post(f"/api/v1/events/{eid}/replay")
    assert replayed.status_code == 201, replayed.text
    assert replayed.json() == {"id": replayed.json()["id"], "replay_of": eid}
    event = (await api.get(f"/api/v1/events/{eid}")).json()
    assert [(n["id"], n["rule_ref"], n["outcome"], n["execution"], n["error"]) for n in event["enforcements"]] == [
        (made["id"], "deploys.echo", "template_error", None, "no such key")
    ]
    assert [r["id"] for r in event["replays"]] == [replayed.json()["id"]]
    error_of(await api.get("/api/v1/events/999"), 404)
    error_of(await api.post("/api/v1/events/999/replay"), 404)
    error_of(await api.get(f"/api/v1/events/{2**63}"), 404)

    listed = await api.get("/api/v1/enforcements", params={"rule": "deploys.echo", "outcome": "template_error"})
    assert [n["id"] for n in listed.json()["items"]] == [made["id"]]
    assert (await api.get("/api/v1/enforcements", params={"event": eid + 1000})).json()["items"] == []
    assert (await api.get(f"/api/v1/enforcements/{made['id']}")).json()["event"] == eid
    error_of(await api.get("/api/v1/enforcements/999"), 404)
    error_of(await api.get("/api/v1/enforcements", params={"outcome": "nope"}), 422)

    since = (await api.one("SELECT now() - interval '1 hour' AS t"))["t"].isoformat()
    window = await api.post("/api/v1/events/replay", json={"trigger": "deploys", "since": since})
    assert window.status_code == 201, window.text
    assert [p["original"] for p in window.json()["replays"]] == [eid, k1.json()["id"]]
    error_of(await api.post("/api/v1/events/replay", json={"trigger": "nope", "since": since}), 404)
    error_of(await api.post("/api/v1/events/replay", json={"trigger": "deploys", "since": "2026-01-01T00:00:00"}), 422)


async def test_execution_delay(api: Api) -> None:
    for delay, low, high in (("90s", 89, 90), (30, 29, 30), (1.5, 0.5, 1.5), ("1m30s", 89, 90)):
        response = await api.post("/api/v1/executions", json={"action_ref": "core.noop", "delay": delay})
        assert response.status_code == 201, response.text
        row = await api.one("SELECT extract(epoch FROM not_before - now())::float8 AS left FROM execution"
                            " WHERE id = %s", (response.json()["id"],))  # fmt: skip
        assert low < row["left"] <= high, (delay, row)
    for delay in ("soon", -1, True, "1e999s", 10**12, [1]):
        bad = await api.post("/api/v1/executions", json={"action_ref": "core.noop", "delay": delay})
        assert "delay" in error_of(bad, 422), delay
    both = {"action_ref": "core.noop", "delay": "1s", "not_before": "2030-01-01T00:00:00+00:00"}
    assert "not both" in error_of(await api.post("/api/v1/executions", json=both), 422)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["\x00", "a\x00", "\ud800"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip
KEYS = st.none() | st.text(string.printable, min_size=0, max_size=8) | st.sampled_from(["k", "k\x00", " k"])


def has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(has_nul(v) for v in value)


async def test_fuzz_emit(api: Api) -> None:
    """Any body: 202, or a 4xx with a message and nothing stored for it."""
    await _trigger(api)
    await _trigger(api, "free", None)
    loop = asyncio.get_running_loop()

    async def post(raw: bytes, key: str | None) -> tuple[int, Any, int]:
        headers = {"Idempotency-Key": key} if key is not None and key.isprintable() and key.isascii() else {}
        before = (await api.one("SELECT count(*) AS n FROM event"))["n"]
        response = await api.post("/api/v1/events", content=raw, headers=headers)
        after = (await api.one("SELECT count(*) AS n FROM event"))["n"]
        return response.status_code, response.json(), after - before

    @hypothesis.settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @hypothesis.given(trigger=st.sampled_from(["deploys", "free", "nope", "a b", ""]) | st.text(max_size=6),
                      payload=JSON, key=KEYS, header=KEYS)  # fmt: skip
    @hypothesis.example(trigger="free", payload={"x": "nul \x00"}, key=None, header=None)
    @hypothesis.example(trigger="free", payload="x" * 4000, key=None, header=None)
    def check(trigger: str, payload: Any, key: str | None, header: str | None) -> None:
        body: dict[str, Any] = {"trigger": trigger, "payload": payload}
        if key is not None:
            body["idempotency_key"] = key
        raw = json.dumps(body).encode()  # (lone surrogates are sent escaped, as JSON allows)
        status, answer, stored = asyncio.run_coroutine_threadsafe(post(raw, header), loop).result(30)
        assert status < 500, (body, status, answer)
        if status == 202:
            assert stored == (0 if answer["repeated"] else 1), (body, answer)
        else:
            assert status >= 400, (body, status, answer)
            assert answer["error"], (body, status, answer)
            assert stored == 0, (body, answer)
            if trigger == "free" and header is None and has_nul(payload):  # refused, and said why
                assert status == 422, (body, answer)

    await asyncio.to_thread(check)
