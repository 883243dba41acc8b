"""Bulk requests (migration 0023): request_execution_batch, the one function behind the
SDK's request_executions and the SQL array forms. Every row is checked (the SQL subset of
JSON Schema, exactly as validate_parameters judges one request; the SDK's full check
before it), a refused row stores nothing and is named, the ids come in request order,
the wake-up exists if and only if the batch commits, and admission keeps FIFO order."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conveyor.domain.errors import InvalidParametersError, UnknownActionError
from conveyor.sdk import request_executions
from conveyor.verbs import common as verbs
from conveyor.verbs import executions
from integration.builders import holders, policy, waiters

Conn = psycopg.Connection[dict[str, Any]]

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "color": {"type": "string", "enum": ["red", "blue"]},
        "label": {"type": "string", "minLength": 2, "maxLength": 5},
        "ratio": {"type": ["number", "null"]},
        "free": {},
    },
    "required": ["n"],
    "additionalProperties": False,
}


def add_action(conn: Conn, ref: str, schema: dict[str, Any]) -> str:
    pack, name = ref.split(".", 1)
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema) "
        "VALUES (%s, %s, %s, 'python', 'python', %s) "
        "ON CONFLICT (ref) DO UPDATE SET parameters_schema = EXCLUDED.parameters_schema",
        (ref, pack, name, Jsonb(schema)),
    )
    return ref


@pytest.fixture
def typed(conn: Conn) -> str:
    return add_action(conn, "test.typed", SCHEMA)


@pytest.fixture
def caller(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An application's connection: no search_path, not autocommit."""
    with psycopg.connect(db_url) as c:
        yield c


def count(conn: Conn) -> int:
    return int(conn.execute("SELECT count(*) AS n FROM execution").fetchone()["n"])


def batch(conn: Conn, refs: list[str], params: list[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM request_execution_batch(%s::text[], %s::jsonb) AS id", (refs, Jsonb(params))
    ).fetchall()
    return [r["id"] for r in rows]


# ---------------------------------------------------------------------------
# The batch check is validate_parameters, row by row
# ---------------------------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-20, 20),
    st.floats(-20, 20, allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "a", "red", "blue", "abcdef", "xy"]),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2),
)
_keys = st.sampled_from(["n", "color", "label", "ratio", "free", "x_1", "other"])
_types = st.sampled_from(["integer", "number", "string", "boolean", "object", "array", "null"])
_property = st.fixed_dictionaries(
    {},
    optional={
        "type": st.one_of(_types, st.lists(_types, max_size=3)),
        "enum": st.lists(_values, max_size=3),
        "minimum": st.integers(-5, 5),
        "maximum": st.integers(-5, 5),
        "minLength": st.integers(0, 4),
        "maxLength": st.integers(0, 4),
    },
)
_schemas = st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={
        "properties": st.dictionaries(_keys, _property, max_size=4),
        "required": st.lists(_keys, max_size=3, unique=True),
        "additionalProperties": st.booleans(),
        "patternProperties": st.dictionaries(st.sampled_from(["^x_", "^o"]), st.just({}), max_size=1),
    },
)
_documents = st.one_of(st.dictionaries(_keys, _values, max_size=5), _values)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schemas, documents=st.lists(_documents, min_size=1, max_size=6))
def test_the_batch_check_refuses_exactly_what_validate_parameters_refuses(
    conn: Conn, schema: dict[str, Any], documents: list[Any]
) -> None:
    add_action(conn, "test.prop", schema)
    refs = ["test.prop"] * len(documents)
    refused = {
        r["i"]
        for r in conn.execute("SELECT i FROM parameters_refused(%s::text[], %s::jsonb)", (refs, Jsonb(documents)))
    }
    for i, doc in enumerate(documents, start=1):
        # validate_parameters judges the document as request_execution stores it (null is {})
        problems = conn.execute(
            "SELECT validate_parameters(%s, coalesce(nullif(%s::jsonb, 'null'), '{}')) AS p",
            (Jsonb(schema), json.dumps(doc)),
        ).fetchone()["p"]
        assert (i in refused) == bool(problems), (schema, doc, problems)


# ---------------------------------------------------------------------------
# Refusals: named, and nothing stored
# ---------------------------------------------------------------------------


def test_a_bad_row_is_named_and_nothing_is_stored(conn: Conn, typed: str) -> None:
    good = {"n": 1, "color": "red"}
    with pytest.raises(psycopg.Error) as refused:
        batch(conn, [typed] * 4, [good, good, {"n": 11}, {"n": "x"}])
    assert refused.value.sqlstate == "CVA02"
    assert "invalid parameters for test.typed: request 3 of 4: n must be <= 10, got 11" in str(refused.value)
    assert count(conn) == 0
    # The array forms (0009, 0020) are the same function: they check too.
    with pytest.raises(psycopg.Error, match=r"request 2 of 2: extra is not a parameter") as refused:
        conn.execute(
            "SELECT request_executions(ARRAY['test.typed', 'test.typed'], ARRAY[%s::jsonb, %s::jsonb])",
            (Jsonb(good), Jsonb({"n": 2, "extra": 1})),
        )
    with pytest.raises(psycopg.Error, match=r"unknown action 'nope\.x'") as unknown:
        batch(conn, [typed, "nope.x"], [good, {}])
    assert unknown.value.sqlstate == "CVA01"
    assert count(conn) == 0


def test_the_sdk_names_the_refused_row(conn: Conn, typed: str, caller: psycopg.Connection[Any]) -> None:
    rows = [(typed, {"n": i % 10 + 1}) for i in range(25_000)] + [(typed, {"n": 0})]
    with pytest.raises(InvalidParametersError, match=r"test\.typed: n: 0 is less than the minimum of 1"):
        request_executions(caller, rows)
    with pytest.raises(UnknownActionError, match=r"nope\.x"):
        request_executions(caller, [(typed, {"n": 1}), ("nope.x", {})])
    caller.commit()
    assert count(conn) == 0


def test_a_refusal_from_the_database_names_its_row(
    conn: Conn, typed: str, caller: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's own checks refuse first; the database's refusals (an action deleted, or its
    schema changed, after the SDK read it) name the row too: an unknown action by its
    position (the error's DETAIL) in the statement's refs, not by the quoted literal."""
    odd = "test.o'dd"  # quote_literal doubles the quote
    schemas = {typed: {}, odd: {}}  # what the SDK read: anything goes
    monkeypatch.setattr(executions, "_parameters_schema", lambda ref, _action: schemas[ref])
    with pytest.raises(UnknownActionError) as unknown:
        request_executions(caller, [(typed, {"n": 1}), (odd, {}), (typed, {"n": 2})])
    assert unknown.value.ref == odd
    with pytest.raises(InvalidParametersError) as invalid:
        request_executions(caller, [(typed, {"n": 1}), (typed, {"n": 11})])
    assert invalid.value.ref == typed
    assert invalid.value.problems == ["request 2 of 2: n must be <= 10, got 11"]
    caller.commit()
    assert count(conn) == 0


def test_an_unknown_action_is_named_only_from_a_known_position(conn: Conn, typed: str) -> None:
    with pytest.raises(psycopg.Error) as refused:
        batch(conn, [typed, "nope.x"], [{"n": 1}, {}])
    assert refused.value.diag.message_detail == "request 2 of 2"
    named = verbs.translate(refused.value, refs=[typed, "nope.x"])
    assert isinstance(named, UnknownActionError)
    assert named.ref == "nope.x"
    # Without the statement's refs (or an action_ref) the database's own error stands.
    assert verbs.translate(refused.value) is refused.value
    assert verbs.translate(refused.value, refs=[typed]) is refused.value


def test_the_full_json_schema_check_holds_for_every_row(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    """A keyword outside the SQL subset (pattern, judged by jsonschema alone) and one inside
    it that jsonschema_rs may judge (multipleOf): every row is checked, not the first."""
    add_action(conn, "test.full", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]+$"}}})
    add_action(conn, "test.multiple", {"type": "object", "properties": {"k": {"type": "integer", "multipleOf": 3}}})
    with pytest.raises(InvalidParametersError, match="does not match"):
        request_executions(caller, [("test.full", {"code": "abc"})] * 100 + [("test.full", {"code": "ABC"})])
    with pytest.raises(InvalidParametersError, match="not a multiple of 3"):
        request_executions(
            caller, [("test.multiple", {"k": 3 * i}) for i in range(100)] + [("test.multiple", {"k": 4})]
        )
    caller.commit()
    assert count(conn) == 0


# ---------------------------------------------------------------------------
# What is stored
# ---------------------------------------------------------------------------


def test_large_batch_in_request_order_across_statements(
    conn: Conn, typed: str, caller: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split into several statements (a small byte budget here), still all or none and in
    request order."""
    monkeypatch.setattr(executions, "_BLOCK_ROWS", 700)
    monkeypatch.setattr(executions, "_BATCH_BYTES", 20_000)
    rows = [(typed if i % 3 else "core.noop", {"n": i % 10 + 1} if i % 3 else {}) for i in range(5_000)]
    ids = request_executions(caller, rows, delay=None)
    assert len(ids) == 5_000
    assert ids == sorted(ids)
    caller.rollback()
    assert count(conn) == 0
    ids = request_executions(caller, rows)
    caller.commit()
    stored = conn.execute("SELECT id, action_ref, parameters, status FROM execution ORDER BY id").fetchall()
    assert [r["id"] for r in stored] == ids
    assert [(r["action_ref"], r["parameters"]) for r in stored] == rows
    assert {r["status"] for r in stored} == {"requested"}


def test_json_null_is_empty_parameters_and_not_before_per_row(conn: Conn) -> None:
    ids = batch(conn, ["core.noop"], [None])
    assert conn.execute("SELECT parameters FROM execution WHERE id = %s", (ids[0],)).fetchone()["parameters"] == {}
    ids = [
        r["id"]
        for r in conn.execute(
            "SELECT id FROM request_execution_batch(ARRAY['core.noop', 'core.noop'], '[{}, {}]',"
            " ARRAY[now() + interval '1 hour', now() - interval '1 s']) AS id"
        )
    ]
    rows = conn.execute(
        "SELECT not_before IS NOT NULL AS held FROM execution WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    assert [r["held"] for r in rows] == [True, False]
    with pytest.raises(psycopg.Error, match="2 refs, 1 parameters"):
        conn.execute("SELECT request_execution_batch(ARRAY['core.noop', 'core.noop'], '[{}]')")


# ---------------------------------------------------------------------------
# Wake-ups and admission
# ---------------------------------------------------------------------------


def _notified(listener: psycopg.Connection[Any], within: float) -> list[str]:
    deadline = time.monotonic() + within
    got: list[str] = []
    while not got and (remaining := deadline - time.monotonic()) > 0:
        got.extend(n.channel for n in listener.notifies(timeout=remaining, stop_after=1))
    return got


def test_the_wake_up_exists_iff_the_batch_commits(db_url: str, caller: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute('LISTEN "conveyor.requested"')
        request_executions(caller, [("core.noop", {})] * 1000)
        assert _notified(listener, 0.3) == []  # not before the commit
        caller.rollback()
        assert _notified(listener, 0.5) == []  # nor after a rollback
        request_executions(caller, [("core.noop", {})] * 1000)
        caller.commit()
        assert _notified(listener, 5.0) == ["conveyor.requested"]


def test_admission_keeps_request_order_for_a_batch(conn: Conn, caller: psycopg.Connection[Any]) -> None:
    add_action(conn, "test.grouped", {"type": "object", "properties": {"host": {"type": "string"}}})
    policy(conn, "test.grouped", 2, ("host",))
    rows = [("test.grouped", {"host": "a" if i % 2 else "b"}) for i in range(10)]
    ids = request_executions(caller, rows)
    caller.commit()
    a = [i for i, (_, p) in zip(ids, rows, strict=True) if p["host"] == "a"]
    b = [i for i, (_, p) in zip(ids, rows, strict=True) if p["host"] == "b"]
    # The first two of each group hold its slots; the others wait in request order.
    assert holders(conn) == sorted(a[:2] + b[:2])
    assert waiters(conn) == sorted(a[2:] + b[2:])
    seqs = conn.execute(
        "SELECT execution FROM execution_admission_queue WHERE group_key ="
        " (SELECT group_key FROM execution_admission_queue WHERE execution = %s) ORDER BY seq",
        (a[-1],),
    ).fetchall()
    assert [r["execution"] for r in seqs] == a[2:]
    # A cancel-method policy refuses beyond its limit, in request order too.
    policy(conn, "core.noop", 3, method="cancel")
    more = request_executions(caller, [("core.noop", {})] * 5)
    caller.commit()
    statuses = {
        r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM execution WHERE id = ANY(%s)", (more,))
    }
    assert [statuses[i] for i in more] == ["requested"] * 3 + ["cancelled"] * 2
