"""Property-based: schemathesis generates requests (valid and invalid) for every operation of
the served OpenAPI document (``/api/v1/openapi.json``) and checks that none gets a 5xx, that
every response matches its documented schema and that every status is documented.

Schemathesis runs ASGI apps on its own event-loop thread, so the app's connection pool is
opened there, by the ASGI lifespan of a thin wrapper.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from conveyor.api.app import create_app
from conveyor.config import Settings
from conveyor.domain.tokens import Role, token_row
from conveyor.store.db import make_pool
from conveyor.store.queries import Q
from conveyor.transport.postgres import PostgresTransport

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance]


class ServedApp:
    """``create_app`` with its pool opened and closed by the ASGI lifespan, on the loop
    that serves the requests."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.settings = Settings(api={"max_body_bytes": 64 * 1024})
        self.pool: AsyncConnectionPool[Any] | None = None
        self.app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.pool = make_pool(self.url, "conveyor", "test-api-schema", 4)
                await self.pool.open(wait=True)
                self.app = create_app(self.settings, self.pool, PostgresTransport(self.url, "conveyor"))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.pool is not None:
                    await self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def seed(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Something to find: executions (one running on worker ``w1``, one waiting for admission
    under a policy), dead letters. Returns path parameters that exist."""
    conn.execute(Q["set_policy"], {"target": "core.echo", "concurrency": 4, "parameters": [], "method": "enqueue"})
    worker = conn.execute(
        "INSERT INTO worker (name, runtimes, actions, capacity, stale_after, lock_grace, lock_epoch, last_heartbeat)"
        " VALUES ('w1', '{python}', '{core.echo}', 10, 3600, 1, pg_postmaster_start_time(), now()) RETURNING id"
    ).fetchone()["id"]
    request = "SELECT request_execution('core.echo', %s) AS id"
    ids = [conn.execute(request, (Jsonb({"message": str(i)}),)).fetchone()["id"] for i in range(5)]
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = %s", (ids[0],))
    conn.execute(Q["assign"], {"ids": [ids[0]], "workers": [worker], "executor": "t"})
    conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": 1})  # ids[0] is running
    letters = []
    for reason, resolution in (("poison", None), ("expired", "rescheduled"), ("rejected", None)):
        body = {"message_id": "m", "message_type": "execution.requested", "created": "2026-01-01T00:00:00+00:00",
                "payload": {"execution_ids": [ids[0]]}}  # fmt: skip
        letters.append(conn.execute(
            "INSERT INTO dead_letter (dedupe_key, transport, queue, routing_key, reason, message_type, payload,"
            " execution, resolution) VALUES (gen_random_uuid()::text, 'postgres', 'conveyor.executor.requests',"
            " 'execution.requested', %s, 'execution.requested', %s, %s, %s) RETURNING id",
            (reason, Jsonb(body), ids[0], resolution),
        ).fetchone()["id"])  # fmt: skip
    ask = conn.execute(request.replace("core.echo", "core.ask"), (Jsonb({"prompt": "ok?"}),)).fetchone()["id"]
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = %s", (ask,))
    inquiry = conn.execute(Q["ask_inquiries"], {"ids": [ask], "executor": "t"}).fetchone()["inquiry"]
    # (issue #13) An event of a custom trigger, and an enforcement a rule made of it.
    conn.execute("SELECT register_trigger('deploys')")
    event = conn.execute("SELECT emit_event('deploys', '{\"x\": 1}') AS id").fetchone()["id"]
    rule = conn.execute("SELECT rule_id FROM register_rule('deploys.echo', 'deploys', '{}', 'core.echo', '{}')")
    enforcement = conn.execute(
        "INSERT INTO enforcement (rule, rule_ref, event, outcome, error)"
        " VALUES (%s, 'deploys.echo', %s, 'template_error', 'boom') RETURNING id",
        (rule.fetchone()["rule_id"], event),
    ).fetchone()["id"]
    return {"execution_id": ids[0], "dead_letter_id": letters[0], "name": "w1", "ref": "core.echo",
            "target": "core.echo", "inquiry_id": inquiry, "event_id": event,
            "enforcement_id": enforcement}  # fmt: skip


@pytest.fixture
def admin_headers(conn: psycopg.Connection[Any]) -> dict[str, str]:
    token, params = token_row("schemathesis", Role.admin)
    conn.execute(Q["create_token"], params)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def existing(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    return seed(conn)


@pytest.fixture
def api_schema(db_url: str, existing: dict[str, Any], admin_headers: dict[str, str]) -> Iterator[Any]:
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", ServedApp(db_url))
    try:
        yield schema
    finally:
        asgi.shutdown_lifespans()  # the pool is closed before the database is dropped


# The event stream never ends by itself (test_api_stream.py reads it), nor an unfinished
# execution's output stream (test_api_output.py); revoking a token may revoke the one these
# requests use (test_api_auth.py covers revocation).
EXCLUDED = {("GET", "/api/v1/executions/stream"), ("GET", "/api/v1/executions/{execution_id}/output/stream"),
            ("DELETE", "/api/v1/tokens/{token_id}")}  # fmt: skip
# 10 examples per operation and mode: the sweep covers every route (about 90 operations with
# issue #13's); the doors with their own fuzzers (events, webhooks, rules, schedules) get more there.
SETTINGS = hypothesis.settings(
    max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],  # no shrinking: report the first failure
)  # fmt: skip


def run_operations(schema: Any, headers: dict[str, str], known: dict[str, Any] | None = None) -> int:
    """Every operation, valid and invalid input (with ``known``: path parameters fixed to
    these, only for the operations that have some). Returns how many runs there were;
    fails with every operation's problems at once."""
    failures: list[str] = []
    runs = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in EXCLUDED:
            continue
        path_parameters = None
        if known is not None:
            names = [p.name for p in operation.path_parameters]
            if not names:
                continue
            path_parameters = {name: known[name] for name in names}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

            @SETTINGS
            @hypothesis.given(case=strategy)
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(headers=dict(headers), checks=CHECKS)

            try:
                check()
            except hypothesis.errors.Unsatisfiable:  # nothing to make invalid
                continue
            except (Exception, BaseExceptionGroup) as exc:  # collected: every operation's problems in one report
                failures.append(f"{operation.label} ({mode.value}): {type(exc).__name__}: {exc}")
            runs += 1
    assert not failures, "\n\n".join(failures)
    return runs


def test_api_conforms_to_its_openapi_document(api_schema: Any, admin_headers: dict[str, str]) -> None:
    """(Schemathesis' own pytest integration, ``from_fixture``, fails on pytest 9: it sets
    ``Function._nodeid``; so the loop is ours.)"""
    assert run_operations(api_schema, admin_headers) >= 25


def test_operations_on_things_that_exist(
    api_schema: Any, admin_headers: dict[str, str], existing: dict[str, Any]
) -> None:
    """The same with path parameters naming a running execution, a pending dead letter,
    a worker and an action: the 200s and 409s are checked too."""
    assert run_operations(api_schema, admin_headers, existing) >= 9
    assert run_operations(api_schema, admin_headers, existing) >= 9  # again: cancelled -> 409, replayed...


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def test_requests_with_any_parameters_are_201_or_422(api_schema: Any, admin_headers: dict[str, str]) -> None:
    """Real actions, arbitrary JSON parameters (huge numbers, NUL characters...; NaN and
    Infinity, which no JSON client sends, are in test_api_executions.py)."""
    operation = api_schema["/api/v1/executions"]["POST"]
    names = st.sampled_from(["message", "seconds", "cmd"]) | st.text(max_size=8)
    parameters = (
        st.fixed_dictionaries({"message": st.text()})
        | st.fixed_dictionaries({"seconds": st.floats(allow_nan=False, allow_infinity=False) | st.integers()})
        | st.fixed_dictionaries({"cmd": st.text()})
        | st.dictionaries(names, JSON, max_size=3)
    )
    refs = st.sampled_from(["core.echo", "core.sleep", "core.local", "core.noop"])
    bodies = st.fixed_dictionaries({"action_ref": refs, "parameters": parameters})

    @hypothesis.settings(SETTINGS, max_examples=60)
    @hypothesis.given(body=bodies)
    @hypothesis.example(body={"action_ref": "core.sleep", "parameters": {"seconds": 10**400}})
    @hypothesis.example(body={"action_ref": "core.echo", "parameters": {"message": "nul \x00 here"}})
    @hypothesis.example(body={"action_ref": "core.echo", "parameters": {"message": "\ud800"}})
    @hypothesis.example(body={"action_ref": "core.local", "parameters": {"cmd": "x" * 60_000}})
    def check(body: dict[str, Any]) -> None:
        case = operation.Case(body=body, media_type="application/json")
        response = case.call_and_validate(headers=dict(admin_headers), checks=CHECKS)
        assert response.status_code in (201, 422), (body, response.status_code, response.text)

    check()


def test_the_openapi_document_describes_every_route(api_schema: Any) -> None:
    paths = set(api_schema.raw_schema["paths"])
    for path in ("/api/v1/executions", "/api/v1/executions/{execution_id}", "/api/v1/executions/{execution_id}/cancel",
                 "/api/v1/executions/{execution_id}/rerun", "/api/v1/executions/stream", "/api/v1/actions",
                 "/api/v1/executions/{execution_id}/output", "/api/v1/executions/{execution_id}/output/stream",
                 "/api/v1/actions/{ref}", "/api/v1/workers", "/api/v1/workers/{name}/drain", "/api/v1/dead-letters",
                 "/api/v1/dead-letters/{dead_letter_id}/replay", "/api/v1/tokens", "/api/v1/policies",
                 "/api/v1/policies/{target}", "/api/v1/inquiries", "/api/v1/inquiries/{inquiry_id}",
                 "/api/v1/inquiries/{inquiry_id}/respond", "/health/live", "/health/ready",
                 "/metrics"):  # fmt: skip
        assert path in paths, sorted(paths)
