"""The dashboard's actions (issue #15), over HTTP in-process: which role gets which button
(cancel for unfinished executions, rerun for finished ones, "retry failed", replay and
purge of dead letters, the admins' /tokens page), that the API itself refuses a viewer, the
error column and the searches (escaped, bounded), the admission badge, and an abandoned
execution's causes."""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from markupsafe import escape
from psycopg.types.json import Jsonb

from conveyor.api import search
from conveyor.store.queries import Q
from integration.api_kit import Api, error_of, make_worker, request, start

SCRIPT = "<script>alert('x')</script>"
ESCAPED = html.escape(SCRIPT).replace("&#x27;", "&#39;")


async def failed(api: Api, worker: int, error: str, parameters: dict[str, Any] | None = None) -> int:
    """A core.echo execution that ran on ``worker`` and failed with ``error``."""
    eid = await request(api, parameters=parameters)
    attempt = await start(api, eid, worker)
    params = {"ids": [eid], "attempts": [attempt], "statuses": ["failed"], "outcomes": ["failed"], "delays": [None],
              "results": [Jsonb({"error": error})], "errors": [error], "worker": worker}  # fmt: skip
    assert [r["id"] for r in await api.sql(Q["finish"], params)] == [eid]
    return eid


def row_of(page: str, eid: int) -> str:
    start = page.index(f'<tr data-id="{eid}"')
    return page[start : page.index("</tr>", start)]


async def test_execution_buttons_follow_the_role_and_the_api_refuses_a_viewer(api: Api) -> None:
    worker = await make_worker(api, "w1")
    waiting = await request(api)
    done = await failed(api, worker, "boom")

    for path in ["/executions", "/_live/executions", f"/executions/{waiting}", f"/executions/{done}"]:
        page = await api.get(path, role="viewer")
        assert page.status_code == 200, page.text
        assert "data-api=" not in page.text, path  # a viewer sees no buttons
        assert 'id="retry-failed"' not in page.text
        assert 'href="/tokens"' not in page.text
    refused = await api.post(f"/api/v1/executions/{waiting}/cancel", role="viewer")
    assert "operator role" in error_of(refused, 403)

    page = (await api.get("/executions", role="operator")).text
    assert f'data-api="/api/v1/executions/{waiting}/cancel"' in row_of(page, waiting)
    assert "/rerun" not in row_of(page, waiting)
    assert f'data-api="/api/v1/executions/{done}/rerun"' in row_of(page, done)
    assert "/cancel" not in row_of(page, done)
    assert 'id="retry-failed"' in page
    assert f'data-query="{html.escape(urlencode({"status": "failed", "limit": "100"}))}"' in page
    assert 'href="/tokens"' not in page  # admins only
    detail = (await api.get(f"/executions/{waiting}", role="operator")).text
    assert f'data-api="/api/v1/executions/{waiting}/cancel"' in detail
    detail = (await api.get(f"/executions/{done}", role="operator")).text
    assert f'data-api="/api/v1/executions/{done}/rerun"' in detail
    # Another status than failed in the filters: nothing for "retry failed" to do.
    assert 'id="retry-failed"' not in (await api.get("/executions?status=completed", role="operator")).text
    assert 'href="/tokens"' in (await api.get("/executions", role="admin")).text


async def test_retry_failed_lists_what_the_filters_match_through_the_api(api: Api) -> None:
    worker = await make_worker(api, "w1")
    one = await failed(api, worker, "disk full", {"message": "a"})
    two = await failed(api, worker, "timeout talking to db", {"message": "b"})
    page = (await api.get("/executions?parameters=message%3Da&error=disk", role="operator")).text
    query = html.unescape(page.split('data-query="', 1)[1].split('"', 1)[0])
    assert "status=failed" in query
    assert "limit=100" in query
    listed = await api.get(f"/api/v1/executions?{query}", role="operator")
    assert listed.status_code == 200, listed.text
    assert [i["id"] for i in listed.json()["items"]] == [one]
    everything = await api.get("/api/v1/executions?status=failed&limit=100", role="operator")
    assert [i["id"] for i in everything.json()["items"]] == [two, one]
    assert "error_head" not in everything.json()["items"][0]  # the dashboard's column only


async def test_error_column_and_searches_are_escaped(api: Api) -> None:
    worker = await make_worker(api, "w1")
    bad = await failed(api, worker, f"{SCRIPT} went wrong " + "x" * 300, {"message": "deploy"})
    good = await request(api, parameters={"message": "other"})
    nap = await request(api, "core.sleep", {"seconds": 5})
    page = (await api.get("/executions")).text
    cell = row_of(page, bad)
    assert SCRIPT not in page
    assert f'<td class="error-head">{ESCAPED} went wrong xxx' in cell
    assert "x" * 200 not in cell  # cut short
    assert "…</td>" in cell
    assert '<td class="error-head"></td>' in row_of(page, good)

    async def ids(query: str) -> list[int]:
        text = (await api.get(f"/_live/executions?{query}")).text
        return [int(x.split('"')[0]) for x in text.split('<tr data-id="')[1:]]

    assert await ids("error=WENT+WRONG") == [bad]  # case-insensitive
    assert await ids("error=nothing+like+it") == []
    assert await ids(f"error={quote(SCRIPT)}") == [bad]
    assert await ids("parameters=message%3Ddeploy") == [bad]
    assert await ids("parameters=seconds%3D5") == [nap]  # 5 read as JSON
    assert await ids("parameters=seconds%3D6") == []
    assert await ids("parameters=message%3Ddeploy+seconds%3D5") == []  # both
    assert await ids(quote_query(parameters='{"message": "other"}')) == [good]
    assert await ids("since=2999-01-01T00:00") == []
    assert await ids("until=2999-01-01T00:00") == [nap, good, bad]
    assert await ids("since=2000-01-01T00:00&until=2999-01-01T00:00:00%2B02:00") == [nap, good, bad]
    assert await ids("until=2000-01-01T00:00") == []

    # The terms come back in the form, escaped; broken ones are said, not applied.
    page = (await api.get(f"/executions?{quote_query(error=SCRIPT, parameters='{nope')}")).text
    assert SCRIPT not in page
    assert f'name="error" value="{ESCAPED}"' in page
    assert "the parameters search is not valid JSON" in page
    assert "since must be a date and time" in (await api.get("/executions?since=yesterday")).text
    assert "needs key=value pairs" in (await api.get("/executions?parameters=justaword")).text
    refused = await api.get("/api/v1/executions?parameters=%7B1%7D")
    assert "not valid JSON" in error_of(refused, 400)


def quote_query(**values: str) -> str:
    return urlencode(values)


async def test_a_search_examines_a_bounded_window_and_pages_on(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "SCAN", 3)
    ids = [await request(api, parameters={"message": "m" if i % 2 else "other"}) for i in range(7)]
    matching = [e for i, e in enumerate(ids) if i % 2]
    first = await api.get("/api/v1/executions?parameters=message%3Dm&limit=10")
    body = first.json()
    window = [e for e in matching if e >= ids[-1] + 1 - 3]
    assert [i["id"] for i in body["items"]] == sorted(window, reverse=True)
    assert body["next_cursor"] == ids[-1] + 1 - 3  # the window's floor: search on below it
    seen = [i["id"] for i in body["items"]]
    cursor = body["next_cursor"]
    while cursor is not None:
        page = (await api.get(f"/api/v1/executions?parameters=message%3Dm&limit=10&before={cursor}")).json()
        seen += [i["id"] for i in page["items"]]
        cursor = page["next_cursor"]
    assert seen == sorted(matching, reverse=True)
    text = (await api.get("/executions?parameters=message%3Dm")).text
    assert "Older →" in text
    assert f"before={ids[-1] + 1 - 3}" in text
    assert 'id="search-window"' in text


async def test_admission_badge_says_which_policy_and_group_and_how_many_are_ahead(api: Api) -> None:
    params = {"target": "core.echo", "concurrency": 1, "parameters": ["message"], "method": "enqueue"}
    await api.sql(Q["set_policy"], params)
    holder, first, second = [await request(api, parameters={"message": "<a>"}) for _ in range(3)]
    other = await request(api, parameters={"message": "b"})
    page = (await api.get("/executions")).text
    assert "data-admission" not in row_of(page, holder)
    assert "data-admission" not in row_of(page, other)
    group = str(escape(json.dumps({"message": "<a>"})))  # as Jinja escapes it
    assert f"waiting for policy core.echo, group {group} (1 at once): 0 ahead" in row_of(page, first)
    assert f"waiting for policy core.echo, group {group} (1 at once): 1 ahead" in row_of(page, second)
    detail = (await api.get(f"/executions/{second}")).text
    assert f"waiting for policy core.echo, group {group}: 1 ahead" in detail
    assert "holding a slot of policy core.echo" in (await api.get(f"/executions/{holder}")).text


async def test_an_abandoned_execution_says_why(api: Api) -> None:
    worker = await make_worker(api, "w1")
    eid = await request(api)
    await start(api, eid, worker)
    await api.sql("UPDATE execution_attempt SET ended = now(), outcome = 'lost', error = %s WHERE execution = %s",
                  (f"worker w1 stopped {SCRIPT}", eid))  # fmt: skip
    await api.sql("UPDATE execution SET status = 'abandoned', ended = now() WHERE id = %s", (eid,))
    page = (await api.get(f"/executions/{eid}")).text
    causes = page.split('id="abandoned-causes"', 1)[1].split("</ol>", 1)[0]
    assert f"attempt 1 on w1: lost: worker w1 stopped {ESCAPED}" in causes
    assert SCRIPT not in page


DOORBELL = {"message_id": "m1", "message_type": "execution.requested", "created": "2024-01-01T00:00:00+00:00",
            "payload": {"execution_ids": []}}  # fmt: skip


async def dead_letter(api: Api, n: int, payload: dict[str, Any], routing_key: str = "execution.requested") -> int:
    """A pending dead letter (a doorbell by default: harmless to publish again)."""
    row = await api.one(Q["record_dead_letter"], {
        "dedupe_key": f"t-{n}", "message_id": f"m{n}", "transport": "postgres", "reason": "expired",
        "queue": "q", "exchange": "x", "routing_key": routing_key, "message_type": payload.get("message_type"),
        "payload": Jsonb(payload), "headers": Jsonb({}), "execution": None, "attempt": None, "worker": None,
        "error": None})  # fmt: skip
    return int(row["id"])


async def test_dead_letter_replay_and_purge_for_operators_only(api: Api) -> None:
    letter = await dead_letter(api, 1, DOORBELL)
    broken = await dead_letter(api, 2, {"n": 1}, "worker.7")
    viewer = (await api.get("/dead-letters", role="viewer")).text
    assert "data-api=" not in viewer
    assert 'id="purge-form"' not in viewer
    assert "need the operator role" in viewer
    assert "operator role" in error_of(await api.delete("/api/v1/dead-letters?all=true", role="viewer"), 403)
    assert "operator role" in error_of(await api.post(f"/api/v1/dead-letters/{letter}/replay", role="viewer"), 403)
    operator = (await api.get("/dead-letters?reason=expired", role="operator")).text
    assert f'data-api="/api/v1/dead-letters/{letter}/replay"' in row_of(operator, letter)
    assert 'id="purge-form"' in operator
    assert "<option selected>expired</option>" in operator.split('id="purge-form"', 1)[1]
    # What the button calls: the API's replay; the row then has no button. A refusal has
    # the API's reason, which the page shows as it is.
    replayed = await api.post(f"/api/v1/dead-letters/{letter}/replay", role="operator")
    assert replayed.json() == {"id": letter, "resolution": "replayed"}
    assert "/replay" not in row_of((await api.get("/_live/dead-letters", role="operator")).text, letter)
    refused = await api.post(f"/api/v1/dead-letters/{broken}/replay", role="operator")
    assert "cannot be replayed" in error_of(refused, 409)
    # What the purge form sends with the reason filter and without "pending ones too".
    purged = await api.delete("/api/v1/dead-letters?reason=expired", role="operator")
    assert purged.json() == {"deleted": 1}  # the replayed one; the pending one stays


async def test_tokens_page_is_for_admins_and_never_shows_a_secret(api: Api) -> None:
    for role in ("viewer", "operator"):
        page = await api.get("/tokens", role=role)
        assert page.status_code == 403
        assert "managing tokens needs the admin role" in page.text
        assert "data-api=" not in page.text
        assert (await api.get("/_live/tokens", role=role)).status_code == 403
        assert "admin role" in error_of(await api.post("/api/v1/tokens", role=role,
                                                       json={"name": "x", "role": "viewer"}), 403)  # fmt: skip
    created = await api.post("/api/v1/tokens", role="admin", json={"name": f"ci {SCRIPT}", "role": "operator"})
    assert created.status_code == 201, created.text
    new = created.json()
    page = (await api.get("/tokens", role="admin")).text
    assert SCRIPT not in page
    assert f"ci {ESCAPED}" in page
    assert new["token"] not in page
    for secret in api.tokens.values():
        assert secret not in page
    assert f"<code>{new['prefix']}…</code>" in page
    assert f'data-api="/api/v1/tokens/{new["id"]}" data-method="DELETE"' in row_of(page, new["id"])
    assert "(you, now)" in page
    assert (await api.delete(f"/api/v1/tokens/{new['id']}", role="admin")).status_code == 204
    live = (await api.get("/_live/tokens", role="admin")).text
    assert 'data-revoked="true"' in row_of(live, new["id"])
    assert "data-api" not in row_of(live, new["id"])
