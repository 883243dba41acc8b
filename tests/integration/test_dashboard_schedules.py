"""The dashboard's schedule pages (issue #13) and what an execution's page says started it:
schedules with kind, expression, time zone, paused or late, next fire times (the stored
next_fire, then croniter's), policies and last slot; a schedule's recent slots (lag,
origin, outcome, execution); "started by rule X (enforcement N, event M)" or "schedule
S, slot T" on the execution's page. Rows are written as the engines would leave them
(automation_kit.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from conveyor.api.dashboard.web import when
from integration.api_kit import Api, request
from integration.automation_kit import INSERT_SLOT, emit, enforce, schedule

SCRIPT = "<script>alert('x')</script>"


async def test_schedules_list_shows_policies_next_fires_and_state(api: Api) -> None:
    nightly = await schedule(api, "nightly", cron="0 3 * * *", timezone="Europe/Paris")
    await schedule(api, "poll", "interval", cron=None, every="90 seconds", paused=True)
    await api.sql("SELECT register_trigger('tick', 'cron')")
    await schedule(api, "late", cron="* * * * *", action=None, trigger="tick", next_in="-1 minute")
    execution = await request(api)
    slot = datetime(2026, 1, 2, 2, 0, tzinfo=UTC)
    await api.sql(INSERT_SLOT, (nightly, slot, "scheduled", "requested", execution, None, slot + timedelta(seconds=2)))

    page = await api.get("/schedules")
    assert page.status_code == 200, page.text
    assert '<a href="/schedules" aria-current="page">Schedules</a>' in page.text
    assert 'data-live="/_live/schedules"' in page.text
    assert '<tr data-schedule="nightly" data-paused="false">' in page.text
    assert "<code>0 3 * * *</code> <small>Europe/Paris</small>" in page.text
    assert '<tr data-schedule="poll" data-paused="true">' in page.text
    assert "every 90.0 s" in page.text
    assert "skip / latest" in page.text
    assert f'<a href="/executions/{execution}">execution {execution}</a>' in page.text
    assert '<span class="badge l-requested">requested</span>' in page.text
    assert 'title="next_fire is past">late' in page.text  # only "late" is overdue
    assert page.text.count("next_fire is past") == 1
    assert 'event on <a href="/events?trigger=tick">tick</a>' in page.text

    # nightly's next fire times: the engine's (as `schedules get` shows), 03:00 Paris on
    # the next three days from the database clock -- not the kit's made-up next_fire.
    row = await api.one("SELECT now() AS now")
    cell = page.text.split('<tr data-schedule="nightly"')[1].split("</tr>")[0]
    local = row["now"].astimezone(ZoneInfo("Europe/Paris"))
    first = local.replace(hour=3, minute=0, second=0, microsecond=0)
    if first <= local - timedelta(seconds=10):
        first += timedelta(days=1)  # wall-clock arithmetic: 03:00 Paris, whatever the UTC offset
    assert f"<b>{when(first)}</b>" in cell
    for t in (first + timedelta(days=1), first + timedelta(days=2)):
        assert f"<br><small>{when(t)}</small>" in cell
    assert cell.count("<br><small>") == 2

    live = await api.get("/_live/schedules")
    assert live.status_code == 200
    assert '<tr data-schedule="late"' in live.text
    assert "<html" not in live.text


async def test_schedule_page_lists_recent_slots(api: Api) -> None:
    sid = await schedule(api, "reports", "interval", cron=None, every="1 hour")
    done = await request(api)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    slots = [
        (base, "scheduled", "requested", done, None, base + timedelta(seconds=1.5)),
        (base + timedelta(hours=1), "catchup", "missed", None, None, base + timedelta(hours=3)),
        (base + timedelta(hours=2), "scheduled", "request_error", None, f"unknown action {SCRIPT}",
         base + timedelta(hours=2, seconds=0.25)),
    ]  # fmt: skip
    for slot in slots:
        await api.sql(INSERT_SLOT, (sid, *slot))
    page = await api.get("/schedules/reports")
    assert page.status_code == 200, page.text
    assert 'data-live="/_live/schedules/reports"' in page.text
    assert SCRIPT not in page.text
    assert "unknown action &lt;script&gt;" in page.text
    first = page.text.split(f'<tr data-slot="{base.isoformat()}" data-outcome="requested">')[1].split("</tr>")[0]
    assert "<td>2026-01-01 00:00:00</td>" in first
    assert '<td class="num">1.500 s</td>' in first  # the lag
    assert "<td>scheduled</td>" in first
    assert f'<a href="/executions/{done}">{done}</a>' in first
    assert '<span class="badge l-missed">missed</span>' in page.text
    assert "<td>catchup</td>" in page.text
    assert '<td class="num">2.0 h</td>' in page.text  # a missed slot recorded 2 h late
    live = await api.get("/_live/schedules/reports")
    assert live.status_code == 200
    assert 'id="schedule-slots"' in live.text
    for missing in ("nope", "%3Cscript%3E"):
        assert (await api.get(f"/schedules/{missing}")).status_code == 404
        assert (await api.get(f"/_live/schedules/{missing}")).status_code == 404


async def test_an_execution_page_says_what_started_it(api: Api) -> None:
    await api.sql("SELECT register_trigger('github.push', 'webhook')")
    await api.sql("SELECT register_rule('deploy-on-push', 'github.push', '{}', 'core.echo', '{}')")
    event = await emit(api, "github.push", {"ref": "main"})
    enforcement, by_rule = await enforce(api, "deploy-on-push", event)
    page = await api.get(f"/executions/{by_rule}")
    assert page.status_code == 200, page.text
    origin = page.text.split('<dd id="execution-origin">')[1].split("</dd>")[0]
    assert origin == (
        f'rule <a href="/rules/deploy-on-push">deploy-on-push</a> (enforcement {enforcement}, '
        f'<a href="/events/{event}">event {event}</a>)'
    )

    sid = await schedule(api, "nightly")
    by_schedule = await request(api)
    slot = datetime(2026, 1, 2, 3, 0, tzinfo=UTC)
    await api.sql(INSERT_SLOT, (sid, slot, "manual", "requested", by_schedule, None, slot))
    page = await api.get(f"/_live/executions/{by_schedule}")
    origin = page.text.split('<dd id="execution-origin">')[1].split("</dd>")[0]
    assert origin == 'schedule <a href="/schedules/nightly">nightly</a>, slot 2026-01-02 03:00:00 UTC'

    plain = await api.get(f"/executions/{await request(api)}")
    assert plain.status_code == 200
    assert "execution-origin" not in plain.text
