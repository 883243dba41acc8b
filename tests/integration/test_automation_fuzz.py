"""Structured fuzzing of the rules and schedules doors (the byte-level fuzzers elsewhere
rarely reach past the parser): rule documents with arbitrary criteria paths, operators,
patterns and templates; schedules with crons built from real field tokens (including
ones that never fire, such as 30 February), odd time zones and intervals. Never a 5xx;
what is accepted reads back, and a schedule's next fire times come back sorted."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.rules.criteria import OPERATORS
from integration.api_kit import Api

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
PATH = st.one_of(
    st.text(max_size=30).map(lambda t: "trigger." + t),
    st.sampled_from(
        [
            "trigger.headers['x-github-event']",
            'trigger.body["a.b"]',
            "trigger.body.commits[0].id",
            "trigger.body[",
            "trigger.['x']",
            "trigger",
            "and",
            "or",
            "not",
        ]
    ),
)
CHECK = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(OPERATORS)) | st.text(max_size=8)}, optional={"pattern": JSON}
)
TEMPLATE = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "{{ trigger.body.x }}",
            "<% $.trigger.body %>",
            "{{ trigger.x ",
            "{{ event.id }}\x00",
            "{{ 'x' * 10**9 }}",
            "<% range(10**9) %>",
            "{% for i in range(9) %}{{ i }}{% endfor %}",
        ]
    ),
)
RULE = st.fixed_dictionaries(
    {"ref": st.sampled_from(["ci.a", "ci.b"]) | st.text(max_size=10), "trigger": st.just("test.push")},
    optional={
        "criteria": st.dictionaries(PATH, CHECK | JSON, max_size=3),
        "action": st.fixed_dictionaries({"ref": st.just("test.echo")},
                                        optional={"parameters": st.dictionaries(st.text(max_size=5), TEMPLATE)}),
        "enabled": JSON,
    },
)  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=RULE)
async def test_fuzzed_rule_documents_are_a_rule_or_a_4xx(api: Api, doc: dict[str, Any]) -> None:
    await api.sql("SELECT register_trigger('test.push', 'custom') WHERE NOT EXISTS "
                  "(SELECT 1 FROM trigger WHERE name = 'test.push')")  # fmt: skip
    r = await api.post("/api/v1/rules", json=doc)
    assert r.status_code in (200, 201, 404, 422), (doc, r.status_code, r.text)
    if r.status_code in (200, 201):
        got = await api.get(f"/api/v1/rules/{doc['ref']}")
        assert got.status_code == 200, got.text
    else:
        assert r.json().get("error"), r.text


FIELD = st.sampled_from(["*", "*/5", "0", "30", "31", "1-5", "2", "L", "?", "MON", "1,15", "59", "60", "*/0", "29"])
CRON = st.one_of(
    st.lists(FIELD, min_size=5, max_size=6).map(" ".join),
    st.sampled_from(["0 0 30 2 *", "0 0 31 4 *", "0 0 29 2 *", "@hourly", "@reboot", "0 0 31 2 1"]),
)
ZONE = st.sampled_from(["UTC", "Europe/Paris", "America/St_Johns", "Pacific/Chatham", "UTC+5", "../etc", "localtime",
                        "Etc/GMT-14", "", "Europe/Paris/../Paris"])  # fmt: skip
EVERY = st.sampled_from([0, 1, 0.5, -1, "1s", "1ms", "10y", 86400 * 365 * 100, "1h30m"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["cron", "every"]), cron=CRON, zone=ZONE, every=EVERY,
       catchup=st.sampled_from(["skip", "latest", "all"]))  # fmt: skip
async def test_fuzzed_schedules_never_500_and_answer_sorted_fire_times(
    api: Api, kind: str, cron: str, zone: str, every: Any, catchup: str
) -> None:
    body = {"name": "fz", "action": "core.noop", "timezone": zone, "catchup": catchup, "catchup_window": "30d"}
    body.update({"cron": cron} if kind == "cron" else {"every": every})
    r = await api.post("/api/v1/schedules", json=body)
    assert r.status_code in (201, 422), (body, r.status_code, r.text)
    if r.status_code == 201:
        got = await api.get("/api/v1/schedules/fz")
        assert got.status_code == 200, got.text
        times = got.json()["next_fire_times"]
        assert times == sorted(times)
        assert (await api.delete("/api/v1/schedules/fz", role="operator")).status_code in (200, 204)
