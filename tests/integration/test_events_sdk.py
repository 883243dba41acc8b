"""The SDK's events (issue #13): emit_event inside the caller's transaction (a rollback
leaves no event and no NOTIFY; a refusal leaves the transaction usable), full JSON Schema
with every path named, idempotency keys, triggers registered and deleted, replays; and the
batch request with a delay (migration 0020)."""

from __future__ import annotations

import concurrent.futures
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from conveyor.domain.delays import DelayError
from conveyor.domain.errors import ConflictError, InvalidPayloadError, InvalidTriggerError, NotFoundError
from conveyor.sdk import Client, request_executions
from conveyor.sdk.events import emit_event, emit_event_once, register_trigger, replay_event, replay_events
from conveyor.store.db import connect_sync
from integration.builders import Conn
from support.polling import eventually

SCHEMA = {"type": "object", "properties": {"service": {"type": "string", "pattern": "^[a-z]+$"},
                                           "replicas": {"type": "integer", "minimum": 1}},
          "required": ["service"]}  # fmt: skip


def events(conn: Conn, trigger: str = "deploys") -> list[dict[str, Any]]:
    return list(conn.execute("SELECT * FROM event WHERE trigger = %s ORDER BY id", (trigger,)).fetchall())


def notifications(listener: psycopg.Connection[Any], first_within: float) -> int:
    """How many NOTIFYs arrive: waits up to ``first_within`` s for the first, then 0.3 s more."""
    got = 0
    deadline = time.monotonic() + first_within
    while (left := deadline - time.monotonic()) > 0:
        for _ in listener.notifies(timeout=left, stop_after=1):
            got += 1
            deadline = time.monotonic() + 0.3
    return got


def test_emit_in_the_callers_transaction(conn: Conn, db_url: str) -> None:
    conn.execute("SELECT register_trigger('deploys', 'custom', %s)", (psycopg.types.json.Jsonb(SCHEMA),))
    with connect_sync(db_url, "conveyor", autocommit=True) as listener:
        listener.execute('LISTEN "conveyor.event"')
        with psycopg.connect(db_url) as caller:  # no search_path: the SDK names the schema
            eid = emit_event(caller, "deploys", {"service": "api"})
            assert eid > 0
            caller.rollback()
        assert events(conn) == []
        # The refusals are raised as errors a user can act on, and the caller's transaction
        # goes on: what it did before and after is kept.
        with psycopg.connect(db_url) as caller:
            caller.execute("CREATE TABLE conveyor.mine (x int)")
            with pytest.raises(InvalidPayloadError) as bad:
                emit_event(caller, "deploys", {"service": "API", "replicas": 0, "x": "\x00"})
            assert bad.value.problems == ["payload.x: contains a NUL character (\\u0000), which cannot be stored"]
            with pytest.raises(InvalidPayloadError) as bad:
                emit_event(caller, "deploys", {"service": "API", "replicas": 0})
            assert bad.value.problems == ["payload.replicas: 0 is less than the minimum of 1",
                                          "payload.service: 'API' does not match '^[a-z]+$'"]  # fmt: skip
            with pytest.raises(NotFoundError, match="unknown trigger 'nope'"):
                emit_event(caller, "nope", {})
            first, repeated = emit_event_once(caller, "deploys", {"service": "api"}, idempotency_key="k")
            assert not repeated
            assert emit_event_once(caller, "deploys", {"service": "api"}, idempotency_key="k") == (first, True)
            with pytest.raises(ConflictError, match="idempotency key 'k' was already used for another event"):
                emit_event(caller, "deploys", {"service": "db"}, idempotency_key="k")
            caller.execute("INSERT INTO conveyor.mine VALUES (1)")
        # One commit, one NOTIFY (none from the rolled-back transaction before it).
        assert notifications(listener, 5) == 1
    assert [(e["id"], e["source"], e["payload"], e["idempotency_key"]) for e in events(conn)] == [
        (first, "sdk", {"service": "api"}, "k")
    ]
    assert conn.execute("SELECT count(*) AS n FROM mine").fetchone() == {"n": 1}
    assert conn.execute("SELECT event FROM event_pending").fetchall() == [{"event": first}]


def test_triggers_and_replays_through_the_client(conn: Conn, db_url: str) -> None:
    with Client(db_url) as client:
        assert client.register_trigger("deploys", SCHEMA, "deploys done") is True
        assert client.register_trigger("deploys", None, "any payload now") is False
        trigger = client.trigger("deploys")
        assert (trigger["type"], trigger["payload_schema"], trigger["description"], trigger["rules"]) == (
            "custom", None, "any payload now", 0)  # fmt: skip
        with pytest.raises(InvalidTriggerError, match="is not a valid JSON Schema: type: 5 is not valid"):
            client.register_trigger("other", {"type": 5})
        with pytest.raises(InvalidTriggerError, match="invalid trigger name 'a b'"):
            client.register_trigger("a b")
        with pytest.raises(NotFoundError):
            client.trigger("a\x00b")
        one = client.emit_event("deploys", [1, "two"])
        two = client.emit_event("deploys")
        assert (one["repeated"], two["repeated"]) == (False, False)
        assert [e["payload"] for e in client.events(trigger="deploys")] == [{}, [1, "two"]]
        with pytest.raises(ConflictError, match="trigger 'deploys' is still in use"):
            client.delete_trigger("deploys")
        with pytest.raises(NotFoundError):
            client.delete_trigger("never")
        replayed = client.replay_event(one["id"])
        event = client.event(one["id"])
        assert (event["enforcements"], [r["id"] for r in event["replays"]]) == ([], [replayed])
        assert client.event(replayed)["replay_of"] == one["id"]
        with pytest.raises(NotFoundError, match="no event 999"):
            client.replay_event(999)
        since = conn.execute("SELECT now() - interval '1 hour' AS t").fetchone()
        assert since is not None
        pairs = client.replay_events("deploys", since["t"])
        assert pairs == [(one["id"], pairs[0][1]), (two["id"], pairs[1][1])]  # replays are not replayed
        with pytest.raises(NotFoundError):
            client.replay_events("never", since["t"])
        with pytest.raises(DelayError, match="must be after"):
            client.replay_events("deploys", since["t"], since["t"])
        client.register_trigger("spare")
        client.delete_trigger("spare")
        assert [t["name"] for t in client.triggers()] == ["deploys"]


def test_module_functions_take_a_connection(db_url: str) -> None:
    with psycopg.connect(db_url) as caller:
        assert register_trigger(caller, "builds") is True
        eid = emit_event(caller, "builds", {"n": 1})
        again = replay_event(caller, eid)
        assert again > eid
        # (until defaults to now(): the start of the transaction, so the window of a later one)
        caller.commit()
        assert replay_events(caller, "builds", caller.execute("SELECT now() - interval '1 day'").fetchone()[0]) == [
            (eid, again + 1)  # the replay in the window is not replayed
        ]


def test_batch_requests_with_a_delay(conn: Conn) -> None:
    ids = request_executions(conn, [("core.echo", {"message": "a"}), ("core.noop", {})], delay=timedelta(seconds=60))
    rows = conn.execute("SELECT extract(epoch FROM not_before - now())::float8 AS left FROM execution"
                        " WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()  # fmt: skip
    assert [59 < r["left"] <= 60 for r in rows] == [True, True]
    past = conn.execute("SELECT now() - interval '1 minute' AS t").fetchone()
    assert past is not None
    ids = request_executions(conn, [("core.echo", {"message": "b"})], not_before=past["t"])
    assert conn.execute("SELECT not_before FROM execution WHERE id = %s", (ids[0],)).fetchone() == {"not_before": None}
    plain = request_executions(conn, [("core.echo", {"message": "c"})])
    assert conn.execute("SELECT not_before FROM execution WHERE id = %s", (plain[0],)).fetchone() == {
        "not_before": None
    }
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="2 refs, 2 parameters and 1 not_before"):
        conn.execute("SELECT request_executions(ARRAY['core.noop', 'core.noop'], ARRAY['{}'::jsonb, '{}'], "
                     "ARRAY[now()])")  # fmt: skip


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_concurrent_retry_with_the_same_key_waits_for_the_first(conn: Conn, db_url: str, first_commits: bool) -> None:
    """The unique (trigger, idempotency_key) decides: the second waits for the first's
    transaction, then answers its event (committed) or stores its own (rolled back)."""
    conn.execute("SELECT register_trigger('deploys')")
    # (Left in this order: a failure rolls the first transaction back, freeing the retry.)
    with (
        concurrent.futures.ThreadPoolExecutor(1) as pool,
        psycopg.connect(db_url, autocommit=True) as second,
        psycopg.connect(db_url) as first,
    ):
        mine = emit_event(first, "deploys", {"n": 1}, idempotency_key="k")
        retry = pool.submit(emit_event_once, second, "deploys", {"n": 1}, idempotency_key="k")
        waiting = (
            "SELECT count(*) AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.datname = current_database()"
        )
        eventually(lambda: conn.execute(waiting).fetchone()["n"] > 0, 10, message="the retry waits")  # type: ignore[index]
        assert not retry.done()
        first.commit() if first_commits else first.rollback()
        got, repeated = retry.result(10)
    assert (got == mine, repeated) == ((True, True) if first_commits else (False, False))
    assert len(events(conn)) == 1
