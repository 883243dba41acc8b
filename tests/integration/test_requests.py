"""Requesting executions: the SQL API, the Python SDK in the caller's own
transaction, and the wake-up NOTIFY sent by the same commit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conveyor.domain.errors import InvalidParametersError, UnknownActionError
from conveyor.sdk import request_execution, request_executions
from conveyor.verbs import executions

Conn = psycopg.Connection[dict[str, Any]]

TYPED_SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "color": {"type": "string", "enum": ["red", "blue"]},
        "label": {"type": "string", "minLength": 2, "maxLength": 5},
        "ratio": {"type": ["number", "null"]},
    },
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture
def typed(conn: Conn) -> str:
    """An action with a schema exercising every rule the SQL validator knows."""
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema) "
        "VALUES ('test.typed', 'test', 'typed', 'python', 'python', %s)",
        (Jsonb(TYPED_SCHEMA),),
    )
    return "test.typed"


@pytest.fixture
def caller(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An application's connection: no search_path, not autocommit, tuple rows."""
    with psycopg.connect(db_url) as c:
        yield c


def count(conn: Conn, where: str = "true") -> int:
    return int(conn.execute(f"SELECT count(*) AS n FROM execution WHERE {where}").fetchone()["n"])


# ---------------------------------------------------------------------------
# The SQL function
# ---------------------------------------------------------------------------


def test_sql_request_rolled_back_leaves_nothing(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    eid = caller.execute("SELECT conveyor.request_execution('core.echo', '{\"message\": \"hi\"}')").fetchone()[0]
    assert isinstance(eid, int)
    assert count(conn) == 0  # not visible before commit
    caller.rollback()
    assert count(conn) == 0


def test_sql_request_committed_exists_once(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    eid = caller.execute("SELECT conveyor.request_execution('core.echo', '{\"message\": \"hi\"}')").fetchone()[0]
    caller.commit()
    rows = conn.execute("SELECT * FROM execution").fetchall()
    assert len(rows) == 1
    row = rows[0]
    assert row["id"] == eid
    assert row["status"] == "requested"
    assert row["action_ref"] == "core.echo"
    assert row["parameters"] == {"message": "hi"}
    assert row["attempt"] == 0
    assert row["worker"] is None


def test_sql_request_defaults_and_parent(conn: Conn) -> None:
    parent = conn.execute("SELECT request_execution('core.noop') AS id").fetchone()["id"]
    child = conn.execute("SELECT request_execution('core.noop', NULL, %s) AS id", (parent,)).fetchone()["id"]
    rows = {r["id"]: r for r in conn.execute("SELECT id, parameters, parent FROM execution").fetchall()}
    assert rows[parent]["parameters"] == {}
    assert rows[child] == {"id": child, "parameters": {}, "parent": parent}


def test_sql_unknown_action(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.Error) as info:
        caller.execute("SELECT conveyor.request_execution('nope.missing', '{}')")
    assert info.value.sqlstate == "CVA01"
    assert info.value.diag.message_primary == "unknown action 'nope.missing'"
    caller.rollback()
    assert count(conn) == 0


# (parameters, a fragment of the message naming the offending parameter)
INVALID: list[tuple[Any, str]] = [
    ({}, "n is required"),
    ({"n": "3"}, 'n must be of type integer, got "3"'),
    ({"n": 1.5}, "n must be of type integer, got 1.5"),
    ({"n": True}, "n must be of type integer, got true"),
    ({"n": 1, "bogus": 1}, "bogus is not a parameter of this action"),
    ({"n": 1, "color": "green"}, 'color must be one of ["red", "blue"], got "green"'),
    ({"n": 0}, "n must be >= 1, got 0"),
    ({"n": 11}, "n must be <= 10, got 11"),
    ({"n": 1, "label": "a"}, "label must be at least 2 characters"),
    ({"n": 1, "label": "abcdef"}, "label must be at most 5 characters"),
    ({"n": 1, "ratio": "half"}, "ratio must be of type number or null"),
    ([1, 2], "parameters must be a JSON object"),
]


def test_sql_invalid_parameters(conn: Conn, caller: psycopg.Connection[Any], typed: str) -> None:
    for parameters, expected in INVALID:
        with pytest.raises(psycopg.Error) as info:
            caller.execute("SELECT conveyor.request_execution(%s, %s)", (typed, Jsonb(parameters)))
        assert info.value.sqlstate == "CVA02", parameters
        message = info.value.diag.message_primary or ""
        assert message.startswith(f"invalid parameters for {typed}: ")
        assert expected in message, (parameters, message)
        caller.rollback()
        assert count(conn) == 0


def test_sql_reports_every_problem_at_once(conn: Conn, typed: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT request_execution(%s, %s)", (typed, Jsonb({"color": "x", "y": 1})))
    message = info.value.diag.message_primary or ""
    for fragment in ("n is required", "color must be one of", "y is not a parameter"):
        assert fragment in message


def test_sql_valid_parameters(conn: Conn, typed: str) -> None:
    valid = [{"n": 1}, {"n": 10, "color": "blue", "label": "ab", "ratio": None}, {"n": 2.0}, {"n": 5, "ratio": 0.5}]
    for parameters in valid:
        eid = conn.execute("SELECT request_execution(%s, %s) AS id", (typed, Jsonb(parameters))).fetchone()["id"]
        row = conn.execute("SELECT status, parameters FROM execution WHERE id = %s", (eid,)).fetchone()
        assert row == {"status": "requested", "parameters": parameters}


def test_sql_accepts_pattern_properties(conn: Conn) -> None:
    schema = {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema) "
        "VALUES ('test.pattern', 'test', 'pattern', 'python', 'python', %s)",
        (Jsonb(schema),),
    )
    conn.execute("SELECT request_execution('test.pattern', '{\"x_a\": 1}')")


def test_sql_validates_the_core_pack(conn: Conn) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT request_execution('core.echo', '{\"message\": 5}')")
    assert info.value.sqlstate == "CVA02"
    assert "message must be of type string" in (info.value.diag.message_primary or "")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT request_execution('core.sleep', '{\"seconds\": -1}')")
    assert "seconds must be >= 0" in (info.value.diag.message_primary or "")
    assert count(conn) == 0


# ---------------------------------------------------------------------------
# The SDK, in the caller's own transaction
# ---------------------------------------------------------------------------


def test_sdk_connection_has_no_search_path(caller: psycopg.Connection[Any]) -> None:
    assert "conveyor" not in caller.execute("SHOW search_path").fetchone()[0]
    caller.rollback()


def test_sdk_request_exists_iff_the_transaction_commits(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    caller.execute("CREATE TABLE public.orders (id serial PRIMARY KEY, execution bigint)")
    caller.commit()

    eid = request_execution(caller, "core.echo", {"message": "rolled back"})
    caller.execute("INSERT INTO public.orders (execution) VALUES (%s)", (eid,))
    caller.rollback()
    assert count(conn) == 0
    assert conn.execute("SELECT count(*) AS n FROM public.orders").fetchone()["n"] == 0

    eid = request_execution(caller, "core.echo", {"message": "kept"})
    caller.execute("INSERT INTO public.orders (execution) VALUES (%s)", (eid,))
    assert count(conn) == 0  # invisible until commit
    caller.commit()
    rows = conn.execute("SELECT id, status, parameters FROM execution").fetchall()
    assert rows == [{"id": eid, "status": "requested", "parameters": {"message": "kept"}}]
    assert conn.execute("SELECT execution FROM public.orders").fetchone()["execution"] == eid


def test_sdk_exception_in_with_block_rolls_back(conn: Conn, db_url: str) -> None:
    with pytest.raises(RuntimeError), psycopg.connect(db_url) as c:  # noqa: PT012
        request_execution(c, "core.noop")
        raise RuntimeError("application failure after the request")
    assert count(conn) == 0
    with psycopg.connect(db_url) as c:
        request_execution(c, "core.noop")
    assert count(conn) == 1


def test_sdk_unknown_action(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    with pytest.raises(UnknownActionError, match=r"unknown action 'nope\.missing'") as info:
        request_execution(caller, "nope.missing", {})
    assert info.value.ref == "nope.missing"
    # The caller's transaction is still usable.
    request_execution(caller, "core.noop")
    caller.commit()
    assert count(conn) == 1


def test_sdk_invalid_parameters(conn: Conn, caller: psycopg.Connection[Any], typed: str) -> None:
    with pytest.raises(InvalidParametersError, match=r"invalid parameters for core\.echo: .*'message'"):
        request_execution(caller, "core.echo", {})
    with pytest.raises(InvalidParametersError) as info:
        request_execution(caller, typed, {"n": 0, "color": "green"})
    message = str(info.value)
    assert message.startswith("invalid parameters for test.typed: ")
    assert "n: 0 is less than the minimum of 1" in message
    assert "color: 'green' is not one of ['red', 'blue']" in message
    assert len(info.value.problems) == 2
    with pytest.raises(InvalidParametersError, match="Additional properties"):
        request_execution(caller, typed, {"n": 1, "extra": True})
    caller.commit()
    assert count(conn) == 0


def test_sdk_translates_database_side_refusals(
    conn: Conn, caller: psycopg.Connection[Any], typed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even if the client-side check is skipped, the database refuses and the SDK says why;
    like a client-side refusal, it leaves the caller's transaction usable."""
    caller.execute("CREATE TABLE public.audit (note text)")
    caller.execute("INSERT INTO public.audit VALUES ('before')")
    monkeypatch.setattr(executions, "validate_parameters", lambda *args: None)
    with pytest.raises(InvalidParametersError, match="n must be >= 1, got 0") as info:
        request_execution(caller, typed, {"n": 0})
    assert info.value.problems == ["n must be >= 1, got 0"]
    monkeypatch.setattr(executions, "_parameters_schema", lambda *args: {})
    with pytest.raises(UnknownActionError, match=r"nope\.gone"):
        request_execution(caller, "nope.gone", {})
    caller.execute("INSERT INTO public.audit VALUES ('after')")
    kept = request_execution(caller, typed, {"n": 1})
    caller.commit()
    assert [r["note"] for r in conn.execute("SELECT note FROM public.audit").fetchall()] == ["before", "after"]
    assert [r["id"] for r in conn.execute("SELECT id FROM execution").fetchall()] == [kept]


def test_sdk_autocommit_connection(conn: Conn, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        eid = request_execution(c, "core.sleep", {"seconds": 0})
    assert conn.execute("SELECT status FROM execution WHERE id = %s", (eid,)).fetchone()["status"] == "requested"


def test_sdk_batch(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    path_before = caller.execute("SHOW search_path").fetchone()[0]
    batch = [
        ("core.echo", {"message": "a"}),
        ("core.noop", {}),
        ("core.sleep", {"seconds": 0.1}),
        ("core.echo", {"message": "b"}),
    ]
    ids = request_executions(caller, batch)
    assert len(ids) == 4
    assert ids == sorted(ids)
    # The search path is the caller's again, inside the transaction and after it.
    assert caller.execute("SHOW search_path").fetchone()[0] == path_before
    caller.rollback()
    assert count(conn) == 0

    ids = request_executions(caller, batch)
    caller.commit()
    assert caller.execute("SHOW search_path").fetchone()[0] == path_before
    rows = conn.execute("SELECT id, action_ref, parameters, status FROM execution ORDER BY id").fetchall()
    assert [r["id"] for r in rows] == ids
    assert [(r["action_ref"], r["parameters"]) for r in rows] == batch
    assert {r["status"] for r in rows} == {"requested"}
    caller.commit()
    assert request_executions(caller, []) == []


def test_sdk_batch_refuses_as_a_whole(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidParametersError, match=r"core\.sleep"):
        request_executions(caller, [("core.noop", {}), ("core.sleep", {"seconds": "x"})])
    with pytest.raises(UnknownActionError, match=r"nope\.x"):
        request_executions(caller, [("core.noop", {}), ("nope.x", {})])
    caller.commit()
    assert count(conn) == 0


def test_sdk_batch_is_a_savepoint_in_the_callers_transaction(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    request_execution(caller, "core.noop")
    request_executions(caller, [("core.noop", {}), ("core.noop", {})])
    assert count(conn) == 0  # nothing committed by the batch itself
    caller.commit()
    assert count(conn) == 3


# ---------------------------------------------------------------------------
# The wake-up NOTIFY
# ---------------------------------------------------------------------------


def _notified(listener: psycopg.Connection[Any], within: float) -> list[psycopg.Notify]:
    """Notifications received within ``within`` seconds (returns at the first one)."""
    deadline = time.monotonic() + within
    got: list[psycopg.Notify] = []
    while not got and (remaining := deadline - time.monotonic()) > 0:
        got.extend(listener.notifies(timeout=remaining, stop_after=1))
    return got


@pytest.fixture
def listener(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute('LISTEN "conveyor.requested"')
        yield c


def test_notify_is_sent_by_the_commit(listener: psycopg.Connection[Any], caller: psycopg.Connection[Any]) -> None:
    request_execution(caller, "core.noop")
    assert _notified(listener, 0.3) == []  # not before the commit
    caller.commit()
    notes = _notified(listener, 5.0)
    assert [n.channel for n in notes] == ["conveyor.requested"]


def test_no_notify_on_rollback(listener: psycopg.Connection[Any], caller: psycopg.Connection[Any]) -> None:
    caller.execute("SELECT conveyor.request_execution('core.noop')")
    caller.rollback()
    assert _notified(listener, 0.5) == []


def test_notify_from_sql_and_batch(listener: psycopg.Connection[Any], caller: psycopg.Connection[Any]) -> None:
    caller.execute("SELECT conveyor.request_execution('core.noop')")
    caller.commit()
    assert [n.channel for n in _notified(listener, 5.0)] == ["conveyor.requested"]
    request_executions(caller, [("core.noop", {})])
    caller.commit()
    assert [n.channel for n in _notified(listener, 5.0)] == ["conveyor.requested"]
