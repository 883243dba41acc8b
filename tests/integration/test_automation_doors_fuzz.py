"""Hypothesis fuzzes the automation doors (issue #25) with arbitrary text, sizes and
nesting: workflow YAML and JSON, rule documents, schedules (POST and PATCH), a webhook's
payload, inquiry answers and event payloads. The text mixes what PostgreSQL cannot store
(NUL, lone surrogates), escape sequences, huge durations and numbers. The property: every
answer is a success or a clear refusal (a 4xx whose JSON names the problem), never a 5xx,
and the API still answers /health/live afterwards. test_automation_fuzz.py builds rule and
schedule documents from real tokens; this module feeds the doors what a careless or
hostile client sends."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import psycopg
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from integration.api_kit import Api
from integration.inquiries.inquiry_kit import ask

# Each door's run stays a few seconds: the whole module well under a minute in CI. A longer
# hunt: CONVEYOR_FUZZ_EXAMPLES=500.
FUZZ = settings(
    max_examples=int(os.environ.get("CONVEYOR_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

SPECIAL = ["\x00", "a\x00b", "\ud800", "x\udcffy", "\x1b[2J", "\u202e", "", " ", "\\x00", "{{ x }}", "<% $.x %>",
           "99999999999d", "1e400", "-0", "NaN", "\n\n", "&a", "*a", "!!python/object:os.system", "é✓😀"]  # fmt: skip
TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(SPECIAL),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=5), st.sampled_from(SPECIAL), st.text(max_size=5)),
    st.integers(1, 3000).map(lambda n: "x" * n),  # around the 2048-byte body limit
)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), TEXT)
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                     max_leaves=12)  # fmt: skip
DEEP = st.integers(1, 1200).map(lambda depth: json.loads("[" * depth + "]" * depth))  # nesting a parser may not like
ANY = st.one_of(VALUE, DEEP)


def refusal_or_success(response: httpx.Response, *ok: int) -> None:
    """The door's property: a listed success, or a 4xx with a JSON message; never a 5xx."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code not in ok:
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
        assert response.headers["content-type"].startswith("application/json"), response.text[:500]
        message = response.json().get("error")
        assert isinstance(message, str), response.text[:500]
        assert message.strip(), response.text[:500]


def as_json(body: Any) -> dict[str, Any]:
    """``content=`` of a JSON body as a client sends it: lone surrogates as \\ud800 escapes
    (httpx's json= writes them raw and fails to encode them)."""
    return {"content": json.dumps(body).encode(), "headers": {"Content-Type": "application/json"}}


async def still_up(api: Api) -> None:
    assert (await api.client.get("/health/live")).status_code == 200


def _yaml(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, RecursionError):
        return json.dumps(doc)


WORKFLOW = st.fixed_dictionaries(
    {"ref": st.just("fz.flow") | TEXT, "tasks": st.dictionaries(
        TEXT | st.just("a"),
        st.fixed_dictionaries({"action": st.just("core.echo") | TEXT}, optional={"input": VALUE, "next": VALUE}),
        max_size=3)},
    optional={"description": TEXT, "vars": ANY, "input": VALUE, "output": VALUE, "version": SCALAR},
)  # fmt: skip


def _aliases(levels: int) -> str:
    """Anchors and aliases, three per level: small (the bound on them is the YAML loader's)."""
    lines = ["  - l0: &l0 [x, x, x]"]
    lines += [f"  - l{i}: &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}]" for i in range(1, levels + 1)]
    return "ref: fz.alias\nvars:\n" + "\n".join(lines) + "\ntasks:\n  a:\n    action: core.noop\n"


ALIASES = st.integers(0, 3).map(_aliases)


@FUZZ
@given(body=st.one_of(
    WORKFLOW.map(lambda d: {"source": _yaml(d)}),
    WORKFLOW.map(lambda d: {"definition": d}),
    TEXT.map(lambda t: {"source": t}),
    ALIASES.map(lambda t: {"source": t}),
    VALUE.map(lambda v: {"definition": v}),
))  # fmt: skip
@example(body={"source": 'ref: fz.flow\ntasks:\n  "\\uD800":\n    action: core.echo\n'})  # found: a 500
async def test_workflow_registration_is_a_workflow_or_a_4xx(api: Api, body: dict[str, Any]) -> None:
    refusal_or_success(await api.post("/api/v1/workflows", **as_json(body)), 201)
    await still_up(api)


RULE = st.fixed_dictionaries(
    {"ref": st.just("fz.rule") | TEXT, "trigger": st.just("fz.push") | TEXT,
     "action": st.fixed_dictionaries({"ref": st.just("core.echo")}, optional={"parameters": VALUE})},
    optional={"description": TEXT, "criteria": VALUE, "enabled": SCALAR},
)  # fmt: skip


@FUZZ
@given(body=st.one_of(RULE.map(_yaml), RULE.map(json.dumps), TEXT, VALUE.map(json.dumps), DEEP.map(json.dumps)))
async def test_rule_registration_is_a_rule_or_a_4xx(api: Api, body: str) -> None:
    await api.sql("SELECT register_trigger('fz.push', 'custom') WHERE NOT EXISTS "
                  "(SELECT 1 FROM trigger WHERE name = 'fz.push')")  # fmt: skip
    encoded = body.encode("utf-8", "surrogatepass")  # a lone surrogate as a client would (mis)encode it
    refusal_or_success(await api.post("/api/v1/rules", content=encoded), 200, 201)
    await still_up(api)


DURATION = st.one_of(st.from_regex(r"\A[0-9]{1,14}(ms|[smhd])\Z"), TEXT, st.integers(-(2**70), 2**70), st.floats())
SCHEDULE = st.fixed_dictionaries(
    {"name": st.just("fz") | TEXT, "every": DURATION},
    optional={"cron": TEXT, "at": TEXT, "catchup_window": DURATION, "description": TEXT,
              "parameters": ANY, "action": st.just("core.echo") | TEXT, "timezone": TEXT, "starts": TEXT,
              "catchup": TEXT, "overlap": TEXT},
)  # fmt: skip


@FUZZ
@given(body=SCHEDULE, change=SCHEDULE.map(lambda d: {k: v for k, v in d.items() if k != "name"}))
@example(body={"name": "fz", "every": "1000000000d"}, change={"catchup_window": "99999999999d"})  # found: a 500
async def test_schedules_post_and_patch_are_a_schedule_or_a_4xx(
    api: Api, body: dict[str, Any], change: dict[str, Any]
) -> None:
    refusal_or_success(await api.post("/api/v1/schedules", **as_json(body)), 201, 409)
    created = await api.post("/api/v1/schedules", json={"name": "fzp", "every": "1h", "action": "core.noop"})
    assert created.status_code in (201, 409), created.text
    request = as_json(change)
    patched = await api.client.patch("/api/v1/schedules/fzp", content=request["content"],
                                     headers={**request["headers"], **api.auth("operator")})  # fmt: skip
    refusal_or_success(patched, 200)
    await still_up(api)


async def _webhook(api: Api) -> None:
    body = {"trigger": "fz.hook", "auth": "none"}
    response = await api.client.put("/api/v1/webhooks/fzhook", json=body, headers=api.auth("admin"))
    assert response.status_code in (200, 201), response.text


@FUZZ
@given(
    payload=st.one_of(ANY.map(json.dumps), TEXT),
    kind=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]),
)
async def test_a_webhook_payload_is_an_event_or_a_4xx(api: Api, payload: str, kind: str) -> None:
    await _webhook(api)
    encoded = payload.encode("utf-8", "surrogatepass")
    response = await api.client.post("/api/v1/webhooks/fzhook", content=encoded, headers={"Content-Type": kind})
    refusal_or_success(response, 202)
    await still_up(api)


@FUZZ
@given(data=ANY)
async def test_an_inquiry_answer_is_recorded_or_a_4xx(api: Api, conn: psycopg.Connection[Any], data: Any) -> None:
    _, iid = ask(conn, {"prompt": "fuzz?", "quorum": 1000})  # stays pending: every example answers it
    response = await api.post(f"/api/v1/inquiries/{iid}/respond", role="admin", **as_json({"data": data}))
    refusal_or_success(response, 200)
    await still_up(api)


@FUZZ
@given(payload=ANY, trigger=st.just("fz.ev") | TEXT, key=st.none() | TEXT)
async def test_an_event_payload_is_an_event_or_a_4xx(api: Api, payload: Any, trigger: str, key: str | None) -> None:
    await api.sql("SELECT register_trigger('fz.ev', 'custom') WHERE NOT EXISTS "
                  "(SELECT 1 FROM trigger WHERE name = 'fz.ev')")  # fmt: skip
    body = {"trigger": trigger, "payload": payload, "idempotency_key": key}
    refusal_or_success(await api.post("/api/v1/events", **as_json(body)), 202)
    await still_up(api)
