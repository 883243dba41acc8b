"""The dashboard's event pages (issue #13), read straight from the 0016 tables: events
(filter by trigger, outcomes per event, replays), an event's page (payload escaped and
bounded, the rules it matched with each enforcement's outcome and execution), the
enforcements (filter by outcome and rule), rules, triggers and webhooks (never a
secret), and a 404 for what does not exist."""

from __future__ import annotations

import html

from psycopg.types.json import Jsonb

from conveyor.api.dashboard.data import SHOWN
from conveyor.api.dashboard.web import pretty
from integration.api_kit import Api
from integration.automation_kit import emit, enforce

SCRIPT = "<script>alert('x')</script>"


async def automation(api: Api) -> dict[str, int]:
    """Two triggers, two rules; an event on each trigger, one replayed; one requested
    execution, one template error; a third event whose rules are still pending."""
    await api.sql("SELECT register_trigger('github.push', 'webhook', NULL, %s)", (f"pushes {SCRIPT}",))
    await api.sql("SELECT register_trigger('ops.alert', 'custom')")
    await api.sql("SELECT register_rule('deploy-on-push', 'github.push', '{}', 'core.echo', %s)",
                  (Jsonb({"message": "{{ event.payload.ref }}"}),))  # fmt: skip
    await api.sql("SELECT register_rule('page-on-alert', 'ops.alert', '{}', 'core.echo', '{}', false)")
    push = await emit(api, "github.push", {"ref": "main", "note": SCRIPT}, "webhook")
    alert = await emit(api, "ops.alert", {"severity": "high"})
    waiting = await emit(api, "ops.alert", {"severity": "low"})
    replay = int((await api.one("SELECT replay_event(%s) AS id", (push,)))["id"])
    ok, execution = await enforce(api, "deploy-on-push", push, message="main")
    bad, _ = await enforce(api, "page-on-alert", alert, action=None, error=f"no such field {SCRIPT}")
    assert execution is not None
    return {"push": push, "alert": alert, "waiting": waiting, "replay": replay, "ok": ok, "bad": bad,
            "execution": execution}  # fmt: skip


async def test_events_list_and_filter(api: Api) -> None:
    ids = await automation(api)
    page = await api.get("/events")
    assert page.status_code == 200, page.text
    for key in ("push", "alert", "waiting", "replay"):
        assert f'<tr data-id="{ids[key]}">' in page.text
    assert '<span class="badge e-requested" data-outcome="requested">1 requested</span>' in page.text
    assert '<span class="badge e-template_error" data-outcome="template_error">1 template_error</span>' in page.text
    assert "rules pending" in page.text  # the waiting event and the replay
    assert f'<a href="/events/{ids["push"]}">{ids["push"]}</a></td>\n    </tr>' in page.text  # the replay's link
    assert 'data-live="/_live/events"' in page.text
    assert '<a href="/events" aria-current="page">Events</a>' in page.text

    only = await api.get("/events?trigger=ops.alert")
    assert only.status_code == 200
    assert f'data-id="{ids["alert"]}"' in only.text
    assert f'data-id="{ids["waiting"]}"' in only.text
    assert f'data-id="{ids["push"]}"' not in only.text
    assert "<option selected>ops.alert</option>" in only.text
    live = await api.get("/_live/events?trigger=ops.alert")
    assert live.status_code == 200
    assert f'data-id="{ids["alert"]}"' in live.text
    assert "<html" not in live.text
    none = await api.get("/events?trigger=nope")
    assert "No events match these filters." in none.text
    bad = await api.get("/events?before=x")
    assert bad.status_code == 200
    assert "before must be a positive integer" in bad.text


async def test_event_page_shows_rules_outcomes_replays_escaped(api: Api) -> None:
    ids = await automation(api)
    page = await api.get(f"/events/{ids['push']}")
    assert page.status_code == 200, page.text
    assert SCRIPT not in page.text  # the payload is user data: escaped
    assert html.escape(SCRIPT).replace("&#x27;", "&#39;") in page.text
    assert '<a href="/rules/deploy-on-push">deploy-on-push</a>' in page.text
    assert f'<a href="/executions/{ids["execution"]}">{ids["execution"]}</a>' in page.text
    assert f'<a href="/events/{ids["replay"]}">event {ids["replay"]}</a>' in page.text  # its replays
    assert "evaluated: 1 matched" in page.text

    replay = await api.get(f"/events/{ids['replay']}")
    assert f'<a href="/events/{ids["push"]}" id="event-replay-of">' in replay.text
    assert "waiting for the rules to be evaluated" in replay.text
    assert "Not evaluated yet." in replay.text

    alert = await api.get(f"/events/{ids['alert']}")
    assert '<span class="badge e-template_error">template_error</span>' in alert.text
    assert "no such field &lt;script&gt;" in alert.text
    assert SCRIPT not in alert.text
    live = await api.get(f"/_live/events/{ids['alert']}")
    assert live.status_code == 200
    assert "data-final" in live.text

    for missing in ("999999", "0", "abc", "9" * 30, "%C2%B2"):  # (² is a digit to str.isdigit)
        assert (await api.get(f"/events/{missing}")).status_code == 404
        assert (await api.get(f"/_live/events/{missing}")).status_code == 404
    assert (await api.get("/executions/%C2%B2")).status_code == 404  # was a 500
    assert "before must be a positive integer" in (await api.get("/executions?before=%C2%B2")).text


async def test_a_large_payload_is_cut_safely(api: Api) -> None:
    await api.sql("SELECT register_trigger('big', 'custom')")
    blob = ("<b>&" * (1 << 18))[: 1 << 20]  # 1 MiB of markup, NUL-free
    eid = await emit(api, "big", {"blob": blob, "tail": SCRIPT})
    page = await api.get(f"/events/{eid}")
    assert page.status_code == 200
    assert "<b>&" not in page.text
    assert SCRIPT not in page.text
    assert 'id="event-payload-cut"' in page.text
    whole = len(pretty({"blob": blob, "tail": SCRIPT}))
    assert f"The first {SHOWN} of {whole} characters" in page.text
    assert len(page.text) < SHOWN * len("&lt;b&gt;&amp;") // 4 + 20_000  # the cut part, escaped, and the page


async def test_enforcements_filters(api: Api) -> None:
    ids = await automation(api)
    page = await api.get("/enforcements")
    assert page.status_code == 200
    assert f'<tr data-id="{ids["ok"]}" data-outcome="requested">' in page.text
    assert f'<tr data-id="{ids["bad"]}" data-outcome="template_error">' in page.text
    assert SCRIPT not in page.text
    assert "no such field &lt;script&gt;" in page.text
    by_outcome = await api.get("/enforcements?outcome=template_error")
    assert f'data-id="{ids["bad"]}"' in by_outcome.text
    assert f'data-id="{ids["ok"]}"' not in by_outcome.text
    by_rule = await api.get("/enforcements?rule=deploy-on-push")
    assert f'data-id="{ids["ok"]}"' in by_rule.text
    assert f'data-id="{ids["bad"]}"' not in by_rule.text
    live = await api.get("/_live/enforcements?rule=deploy-on-push")
    assert live.status_code == 200
    assert f'data-id="{ids["ok"]}"' in live.text
    unknown = await api.get("/enforcements?outcome=<x>")
    assert unknown.status_code == 200
    assert "unknown outcome &#39;&lt;x&gt;&#39;" in unknown.text


async def test_rules_and_rule_page(api: Api) -> None:
    ids = await automation(api)
    page = await api.get("/rules")
    assert page.status_code == 200
    assert '<tr data-rule="deploy-on-push">' in page.text
    assert f'<a href="/executions/{ids["execution"]}">execution {ids["execution"]}</a>' in page.text
    assert '<span class="badge s-paused">disabled</span>' in page.text  # page-on-alert
    rule = await api.get("/rules/deploy-on-push")
    assert rule.status_code == 200
    assert "{{ event.payload.ref }}" in rule.text  # its parameters' template, as text
    assert f'<tr data-id="{ids["ok"]}" data-outcome="requested">' in rule.text
    assert (await api.get("/rules/nope")).status_code == 404
    assert (await api.get("/rules/%3Cscript%3E")).status_code == 404


async def test_triggers_and_webhooks_never_show_a_secret(api: Api) -> None:
    await automation(api)
    await api.sql(
        "INSERT INTO webhook (name, trigger, auth, secret, description) VALUES ('gh', 'github.push', 'hmac',"
        " 'hush-hmac-secret', %s)",
        (SCRIPT,),
    )
    await api.sql("SELECT register_trigger('hooked', 'webhook')")
    await api.sql("INSERT INTO webhook (name, trigger, auth, token_hash, enabled) VALUES ('b', 'hooked', 'bearer',"
                  " 'deadbeefhash', false)")  # fmt: skip
    page = await api.get("/triggers")
    assert page.status_code == 200
    assert "hush-hmac-secret" not in page.text
    assert "deadbeefhash" not in page.text
    assert SCRIPT not in page.text
    assert '<tr data-trigger="github.push">' in page.text
    assert '<tr data-webhook="gh">' in page.text
    assert "<td>hmac</td>" in page.text
    assert "<td>bearer</td>" in page.text
    assert "<code>X-Hub-Signature-256</code>" in page.text
    # github.push: the event and its replay.
    assert '<td class="num">2</td>' in page.text
