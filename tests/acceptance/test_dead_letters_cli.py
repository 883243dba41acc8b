"""Acceptance: ``conveyor dead-letters list|show|replay|purge`` as an operator uses them.

Dead letters are inserted with SQL (the handler that normally writes them has its own
tests); every check goes through the real command line in a subprocess. Independent
read-only commands run concurrently to keep the file quick.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import typer
from psycopg.types.json import Jsonb

from acceptance.helpers import conveyor_env, describe, run_cli
from conveyor.cli.dead_letters import parse_duration

pytestmark = pytest.mark.acceptance

Conn = psycopg.Connection[dict[str, Any]]
CREATED = "2026-01-01T00:00:00+00:00"


def _envelope(message_type: str, payload: dict[str, Any], message_id: str = "m") -> dict[str, Any]:
    return {"message_id": message_id, "message_type": message_type, "created": CREATED, "payload": payload}


def _dispatch(execution: int, attempt: int, worker: int) -> dict[str, Any]:
    return _envelope(
        "execution.scheduled",
        {"execution_id": execution, "attempt": attempt, "worker_id": worker, "scheduled": CREATED},
        f"dispatch-{execution}-{attempt}",
    )


def _insert(
    conn: Conn,
    *,
    reason: str = "expired",
    resolution: str | None = "rescheduled",
    payload: dict[str, Any] | None = None,
    routing_key: str = "execution.requested",
    queue: str = "conveyor.executor.requests",
    transport: str = "postgres",
    execution: int | None = None,
    age: str = "1 minute",
    headers: dict[str, Any] | None = None,
) -> int:
    body = payload if payload is not None else _envelope("execution.requested", {"execution_ids": []})
    row = conn.execute(
        """INSERT INTO dead_letter (dedupe_key, message_id, transport, queue, routing_key, reason, message_type,
                                    payload, headers, execution, attempt, worker, first_seen, last_seen,
                                    resolution, resolved, resolved_by, detail)
           VALUES (gen_random_uuid()::text, %(message_id)s, %(transport)s, %(queue)s, %(routing_key)s, %(reason)s,
                   %(message_type)s, %(payload)s, %(headers)s, %(execution)s, %(attempt)s, %(worker)s,
                   now() - %(age)s::interval, now() - %(age)s::interval, %(resolution)s,
                   CASE WHEN %(resolution)s::text IS NULL THEN NULL ELSE now() END,
                   CASE WHEN %(resolution)s::text IS NULL THEN NULL ELSE 'test' END,
                   CASE WHEN %(resolution)s::text IS NULL THEN NULL ELSE 'set up by the test' END)
           RETURNING id""",
        {
            "message_id": body.get("message_id"),
            "transport": transport,
            "queue": queue,
            "routing_key": routing_key,
            "reason": reason,
            "message_type": body.get("message_type"),
            "payload": Jsonb(body),
            "headers": Jsonb(headers or {}),
            "execution": execution,
            "attempt": (body.get("payload") or {}).get("attempt") if isinstance(body.get("payload"), dict) else None,
            "worker": (body.get("payload") or {}).get("worker_id") if isinstance(body.get("payload"), dict) else None,
            "age": age,
            "resolution": resolution,
        },
    ).fetchone()
    assert row is not None
    return int(row["id"])


def _row(conn: Conn, dead_letter_id: int) -> dict[str, Any] | None:
    return conn.execute("SELECT * FROM dead_letter WHERE id = %s", (dead_letter_id,)).fetchone()


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    return result


def _fails(result: subprocess.CompletedProcess[str], text: str, code: int = 1) -> None:
    """A refusal: the given exit code, the message, no traceback."""
    assert result.returncode == code, describe(result)
    assert text in result.stderr, describe(result)
    assert "Traceback" not in result.stderr + result.stdout, describe(result)


def _many(env: Mapping[str, str], *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Run independent commands at once (each is its own process)."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda args: run_cli("dead-letters", *args, env=env), commands))


def _ids(result: subprocess.CompletedProcess[str]) -> list[int]:
    return [r["id"] for r in json.loads(_ok(result).stdout)]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


# -- list, show, errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1.5h", 5400), (" 0 ", 0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "-5", "5x", "1 fortnight", "1h30m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="is not a duration"):
        parse_duration(text)


def test_list_filters_show_and_errors(conn: Conn, env: dict[str, str]) -> None:
    old = _insert(conn, reason="expired", resolution="failed", payload=_dispatch(7, 2, 3), execution=7, age="2 days",
                  routing_key="execution.scheduled.worker.3", queue="conveyor.worker.3.executions")  # fmt: skip
    pending = _insert(conn, reason="poison", resolution=None, age="10 minutes",
                      headers={"x-conveyor-error": "boom", "x-delivery-count": 4})  # fmt: skip
    rejected = _insert(conn, reason="rejected", resolution="invalid", payload={"raw": "not json"}, age="3 hours")
    redelivered = _insert(conn, reason="max_redeliveries", resolution="stale", age="30 seconds")

    results = _many(
        env,
        ("list", "--json"),
        ("list", "--json", "--reason", "expired"),
        ("list", "--json", "--resolution", "pending"),
        ("list", "--json", "--execution", "7"),
        ("list", "--json", "--queue", "conveyor.executor.requests", "--since", "2h"),
        ("list", "--json", "--since", "1d", "--limit", "2"),
        ("list",),
        ("show", str(pending)),
        ("show", str(old), "--json"),
        ("show", "999999"),
        ("list", "--reason", "bogus"),
        ("list", "--since", "5 fortnights"),
    )
    everything, expired, pending_only, by_execution, recent_in_queue, day_limited = results[:6]
    assert _ids(everything) == [redelivered, rejected, pending, old]  # newest first
    assert _ids(expired) == [old]
    assert _ids(pending_only) == [pending]
    assert json.loads(pending_only.stdout)[0]["resolution"] is None
    assert _ids(by_execution) == [old]
    assert _ids(recent_in_queue) == [redelivered, pending]
    assert _ids(day_limited) == [redelivered, rejected]

    table = _ok(results[6]).stdout
    for text in ("max_redeliveries", "pending", "conveyor.worker.3.executions", "set up by the test"):
        assert text in table, table
    shown = _ok(results[7]).stdout
    for text in ("poison", "pending", '"x-conveyor-error": "boom"', '"execution_ids": []', "dedupe_key", "last_seen"):
        assert text in shown, shown
    detail = json.loads(_ok(results[8]).stdout)
    assert detail["payload"] == _dispatch(7, 2, 3)
    assert (detail["reason"], detail["resolution"], detail["execution"], detail["worker"]) == (
        "expired",
        "failed",
        7,
        3,
    )

    _fails(results[9], "no dead letter with id 999999")
    _fails(results[10], "'bogus' is not one of", code=2)
    _fails(results[11], "is not a duration", code=2)


# -- replay -----------------------------------------------------------------------------------


def test_replay_on_postgres(conn: Conn, env: dict[str, str]) -> None:
    dispatch = _insert(conn, reason="expired", resolution="rescheduled", payload=_dispatch(5, 1, 2), execution=5,
                       routing_key="execution.scheduled.worker.2", queue="conveyor.worker.2.executions")  # fmt: skip
    poison = _insert(conn, reason="poison", resolution=None, execution=5,
                     payload=_envelope("execution.requested", {"execution_ids": [5]}))  # fmt: skip
    invalid = _insert(conn, reason="rejected", resolution="invalid", payload={"raw": "not json at all"})
    not_ours = _insert(conn, reason="rejected", resolution="stale", payload={"message_type": "order.created"})
    conn.execute('LISTEN "conveyor.worker.2"')

    # By id: published again (a NOTIFY to the worker on this transport) and marked replayed.
    _ok(run_cli("dead-letters", "replay", str(dispatch), env=env))
    assert [n.channel for n in conn.notifies(timeout=2, stop_after=1)] == ["conveyor.worker.2"]
    row = _row(conn, dispatch)
    assert row is not None
    assert (row["resolution"], row["resolved_by"]) == ("replayed", "cli")
    assert "execution.scheduled.worker.2" in row["detail"], row
    assert "was rescheduled" in row["detail"], row

    # Refusals leave the rows as they were: one message per letter, exit 1.
    results = _many(
        env,
        ("replay", str(invalid), str(not_ours), "999999"),
        ("replay",),
        ("replay", str(poison), "--reason", "poison"),
        ("replay", "--reason", "poison"),  # no --yes, no terminal: not confirmed
    )
    _fails(results[0], f"dead letter {invalid} cannot be replayed: its body is not a Conveyor message")
    _fails(results[0], f"dead letter {not_ours} cannot be replayed: its body is not a valid Conveyor message")
    _fails(results[0], "no dead letter with id 999999")
    _fails(results[1], "replay needs dead letter ids or at least one filter")
    _fails(results[2], "give dead letter ids or filters, not both")
    _fails(results[3], "not confirmed; nothing replayed")
    for dead_letter_id, resolution in ((invalid, "invalid"), (not_ours, "stale"), (poison, None)):
        row = _row(conn, dead_letter_id)
        assert row is not None
        assert row["resolution"] == resolution, row

    # By filter with --yes: the pending poison letter; the dispatch already replayed is left out.
    result = _ok(run_cli("dead-letters", "replay", "--execution", "5", "--yes", env=env))
    assert f"dead letter {poison}: replayed to execution.requested" in result.stdout, describe(result)
    assert f"dead letter {dispatch}:" not in result.stdout, describe(result)
    row = _row(conn, poison)
    assert row is not None
    assert row["resolution"] == "replayed", row


def test_replay_on_rabbitmq_writes_an_outbox_row(conn: Conn, db_url: str, rabbitmq_url: str, mq_prefix: str) -> None:
    env = conveyor_env(db_url, CONVEYOR__TRANSPORT="rabbitmq", CONVEYOR__MESSAGE_QUEUE__URL=rabbitmq_url,
                       CONVEYOR__MESSAGE_QUEUE__PREFIX=mq_prefix)  # fmt: skip
    dispatch = _insert(conn, transport="rabbitmq", reason="expired", resolution="failed", payload=_dispatch(9, 3, 4),
                       execution=9, routing_key="execution.scheduled.worker.4",
                       queue=f"{mq_prefix}.worker.4.executions")  # fmt: skip
    completed = _insert(conn, transport="rabbitmq", reason="max_redeliveries", resolution="stale",
                        payload=_envelope("execution.completed", {"execution_ids": [9]}),
                        routing_key="execution.completed")  # fmt: skip
    conn.execute("SELECT set_transport_route('rabbitmq')")  # as the installation's executors declare at start

    _ok(run_cli("dead-letters", "replay", str(dispatch), str(completed), env=env))
    outbox = conn.execute("SELECT exchange, routing_key, message_type, payload FROM outbox ORDER BY id").fetchall()
    assert outbox == [
        {"exchange": "executions", "routing_key": "execution.scheduled.worker.4", "message_type": "execution.scheduled",
         "payload": _dispatch(9, 3, 4)["payload"]},
        {"exchange": "executions", "routing_key": "execution.completed", "message_type": "execution.completed",
         "payload": {"execution_ids": [9]}},
    ]  # fmt: skip
    for dead_letter_id in (dispatch, completed):
        row = _row(conn, dead_letter_id)
        assert row is not None
        assert row["resolution"] == "replayed", row
        assert "rabbitmq transport" in row["detail"], row


# -- purge ------------------------------------------------------------------------------------


def test_purge(conn: Conn, env: dict[str, str]) -> None:
    old_resolved = _insert(conn, resolution="rescheduled", age="3 days")
    old_pending = _insert(conn, reason="poison", resolution=None, age="3 days")
    new_resolved = _insert(conn, reason="rejected", resolution="invalid", payload={"raw": "x"}, age="1 minute")
    new_pending = _insert(conn, reason="poison", resolution=None, age="1 minute")

    def remaining() -> list[int]:
        return [r["id"] for r in conn.execute("SELECT id FROM dead_letter ORDER BY id").fetchall()]

    results = _many(
        env,
        ("purge", "--include-pending"),
        ("purge", "--resolution", "pending", "--yes"),
        ("purge", "--all"),  # no --yes, no terminal: not confirmed
    )
    _fails(results[0], "purge needs at least one filter")
    _fails(results[1], "add --include-pending")
    _fails(results[2], "not confirmed; nothing purged")
    assert remaining() == [old_resolved, old_pending, new_resolved, new_pending]

    # Resolved ones only by default.
    result = _ok(run_cli("dead-letters", "purge", "--older-than", "1d", "--yes", env=env))
    assert "purged 1 dead letter(s)" in result.stdout, describe(result)
    assert remaining() == [old_pending, new_resolved, new_pending]
    result = _ok(run_cli("dead-letters", "purge", "--older-than", "172800", "--include-pending", "-y", env=env))
    assert "purged 1 dead letter(s)" in result.stdout, describe(result)
    assert remaining() == [new_resolved, new_pending]
    result = _ok(run_cli("dead-letters", "purge", "--all", "--yes", env=env))
    assert "purged 1 dead letter(s)" in result.stdout, describe(result)
    assert remaining() == [new_pending]
