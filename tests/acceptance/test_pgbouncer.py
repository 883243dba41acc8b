"""Acceptance: Conveyor behind a real PgBouncer (Debian's, 1.18) in transaction pooling
mode, with a pool of 3 server connections shared by every process's pool.

Real processes (an executor, two workers, an API) reach the database through PgBouncer
(``database.url``, ``database.pooler: transaction``); what needs one server session
(the workers' liveness locks, LISTEN, the duty and migration locks, the CLI) goes to
PostgreSQL itself (``database.direct_url``). Requests come through the pooler too: the
SDK inside a transaction of a pooled connection, and the REST API. A worker is SIGKILLed
mid-run; its work is recovered through its liveness lock. The second test shows what the
settings prevent: server-side prepared statements through this pooler break (psycopg
prepares a statement run 5 times on a connection, and the next transaction lands on a
server session that lacks it), and a pooled session without the schema on its
search_path is refused at start.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from acceptance.helpers import Proc, Procs, conveyor_env, describe, until
from acceptance.pgbouncer_kit import Bouncer, pgbouncer, problem, unavailable
from acceptance.recovery_kit import (
    RECOVERY_SETTINGS,
    Conn,
    attempts,
    start_executor,
    start_worker,
    terminate_liveness_session,
    worker_row,
)
from acceptance.test_api_cli import free_port
from conveyor.sdk import request_executions

pytestmark = pytest.mark.acceptance

POOL = 3  # PgBouncer's server connections for the test database
ECHOES = 300
SLEEPERS = 6


@pytest.fixture
def bouncer() -> Iterator[Bouncer]:
    reason = problem()
    if reason:
        unavailable(reason)
    started = pgbouncer(pool_size=POOL)
    try:
        running = started.__enter__()
    except RuntimeError as exc:
        unavailable(f"cannot start pgbouncer: {exc}")
    try:
        yield running
    finally:
        started.__exit__(None, None, None)


def _dbname(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def _serve_schema(db: Conn, db_url: str) -> None:
    """What an operator does once for a pooler: the schema (and the idle-transaction bound)
    as the database's defaults, since no startup option gets through. This test's own
    database only."""
    name = sql.Identifier(_dbname(db_url))
    db.execute(sql.SQL("ALTER DATABASE {} SET search_path = conveyor, public").format(name))
    db.execute(sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = '60s'").format(name))


@pytest.fixture
def env(db_url: str, bouncer: Bouncer, transport_env: dict[str, str]) -> dict[str, str]:
    """Every process through the pooler, on either transport (RabbitMQ's relay and dead
    letters use the pool; its workers have no LISTEN session, only the liveness one)."""
    return conveyor_env(
        bouncer.url(_dbname(db_url)),
        **transport_env,
        CONVEYOR__DATABASE__DIRECT_URL=db_url,
        CONVEYOR__DATABASE__POOLER="transaction",
        CONVEYOR__DATABASE__POOL_SIZE=4,
        CONVEYOR__LOG__JSON="true",
        # The recovery duties under session advisory locks: on the duty-lock connection, direct.
        CONVEYOR__EXECUTOR__EXCLUSIVE_DUTIES="true",
        **RECOVERY_SETTINGS,
    )


def _problems(proc: Proc) -> list[str]:
    """Log lines of errors (JSON logs), tracebacks and prepared-statement failures."""
    found = []
    for line in (proc.stdout() + proc.stderr()).splitlines():
        try:
            level = json.loads(line).get("level") if line.startswith("{") else None
        except ValueError:
            level = None
        if level in ("error", "critical") or "Traceback" in line or "prepared statement" in line:
            found.append(line)
    return found


def _start_api(procs: Procs) -> str:
    port = free_port()
    procs.start("api", name="api", env={**procs.env, "CONVEYOR__API__PORT": str(port)}).wait_for_log("API listening")
    return f"http://127.0.0.1:{port}"


def _token(procs: Procs) -> str:
    result = procs.run("tokens", "create", "--role", "operator")  # the CLI: over the direct URL
    assert result.returncode == 0, describe(result)
    return result.stdout.splitlines()[-1]


def _sessions(db: Conn) -> tuple[int, set[str]]:
    """The test database's backends: how many PgBouncer holds (no process tag ``[tag]``:
    pooled sessions carry ``<tag>``, or none), and the names of the direct ones."""
    rows = db.execute(
        "SELECT application_name AS name FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchall()
    direct = {r["name"].rsplit(" [", 1)[0] for r in rows if re.search(r"\[[0-9a-f]{12}\]$", r["name"])}
    return sum(1 for r in rows if not re.search(r"\[[0-9a-f]{12}\]$", r["name"])), direct


def _statuses(db: Conn, ids: list[int]) -> Counter[str]:
    rows = db.execute("SELECT status FROM execution WHERE id = ANY(%s)", (ids,)).fetchall()
    return Counter(r["status"] for r in rows)


def _db_stats(bouncer: Bouncer, database: str) -> dict[str, Any]:
    return next(r for r in bouncer.admin("SHOW STATS") if r["database"] == database)


def test_work_through_pgbouncer_in_transaction_mode(
    procs: Procs, env: dict[str, str], db: Conn, db_url: str, bouncer: Bouncer
) -> None:
    _serve_schema(db, db_url)
    database = _dbname(db_url)
    executor = start_executor(procs, env)
    workers = {n: start_worker(procs, env, n, "--concurrency", "8") for n in ("wa", "wb")}
    token = _token(procs)
    api_url = _start_api(procs)
    api = procs.started[-1]

    began = time.monotonic()
    # Requests through the pooler: the SDK in transactions of a pooled connection (no
    # server-side prepares on it either), and the REST API.
    with psycopg.connect(bouncer.url(database), prepare_threshold=None, row_factory=dict_row) as pooled:
        sleepers = request_executions(pooled, [("core.sleep", {"seconds": 4})] * SLEEPERS)
        pooled.commit()
        echoes: list[int] = []
        for start in range(0, ECHOES - 20, 40):
            echoes += request_executions(
                pooled, [("core.echo", {"message": f"m{i}"}) for i in range(start, start + 40)]
            )
            pooled.commit()

    # Mid-run: a worker running sleepers, echoes still in flight, is SIGKILLed.
    seen = [_sessions(db)]

    def victim() -> str | None:
        seen.append(_sessions(db))
        rows = db.execute(
            "SELECT w.name FROM execution e JOIN worker w ON w.id = e.worker"
            " WHERE e.id = ANY(%s) AND e.status = 'running'",
            (sleepers,),
        ).fetchall()
        return rows[0]["name"] if rows else None

    name = until(procs, victim, timeout=30, interval=0.01)
    lost = [r["id"] for r in db.execute(
        "SELECT e.id FROM execution e JOIN worker w ON w.id = e.worker"
        " WHERE e.id = ANY(%s) AND e.status = 'running' AND w.name = %s", (sleepers, name)
    ).fetchall()]  # fmt: skip
    killed_at = datetime.now(UTC)
    workers[name].kill()
    assert workers[name].returncode == -signal.SIGKILL
    [survivor] = set(workers) - {name}
    in_flight = sum(n for status, n in _statuses(db, echoes).items() if status != "completed")

    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=30) as client:
        for i in range(len(echoes), ECHOES):
            response = client.post(
                "/api/v1/executions", json={"action_ref": "core.echo", "parameters": {"message": f"m{i}"}}
            )
            assert response.status_code == 201, response.text
            echoes.append(response.json()["id"])

        # A cancel through the API, on the survivor.
        long = client.post("/api/v1/executions", json={"action_ref": "core.sleep", "parameters": {"seconds": 60}})
        assert long.status_code == 201, long.text
        long_id = long.json()["id"]
        until(procs, lambda: _statuses(db, [long_id])["running"] == 1, timeout=30)
        cancelled = client.post(f"/api/v1/executions/{long_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text

        def all_done() -> bool:
            seen.append(_sessions(db))
            return _statuses(db, echoes + sleepers) == Counter({"completed": ECHOES + SLEEPERS})

        until(procs, all_done, timeout=60)
        elapsed = time.monotonic() - began
        until(procs, lambda: _statuses(db, [long_id]) == Counter({"cancelled": 1}), timeout=20)
        shown = client.get(f"/api/v1/executions/{echoes[-1]}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["status"] == "completed", shown.text

    # Exactly once: one completed attempt each; only the victim's running sleepers lost one.
    rows = db.execute(
        "SELECT execution, worker_name, outcome, started, ended FROM execution_attempt"
        " WHERE execution = ANY(%s) ORDER BY execution, attempt",
        (echoes + sleepers,),
    ).fetchall()
    completed = Counter(r["execution"] for r in rows if r["outcome"] == "completed")
    assert completed == Counter({eid: 1 for eid in echoes + sleepers})
    others = {(r["execution"], r["worker_name"], r["outcome"]) for r in rows if r["outcome"] != "completed"}
    # The sleepers it ran were lost with it; an echo it had just started may be too.
    assert {(eid, name, "worker_lost") for eid in lost} <= others, others
    assert {(w, outcome) for _, w, outcome in others} == {(name, "worker_lost")}, others
    results = db.execute("SELECT id, result FROM execution WHERE id = ANY(%s)", (echoes,)).fetchall()
    assert sorted(r["result"]["data"] for r in results) == sorted(f"m{i}" for i in range(ECHOES))

    # Recovered through the liveness lock (held over the direct connection), not the
    # heartbeat: the worker was judged gone with its process, within the staleness bound.
    assert worker_row(db, name)["inactive_reason"] == "process_gone"
    retried = [attempts(db, eid)[1] for eid in lost]
    recovery = max(a["started"] for a in retried) - killed_at
    assert recovery < timedelta(seconds=3), recovery
    assert {a["worker_name"] for a in retried} == {survivor}

    # The pools went through PgBouncer: never more server sessions than its pool, and
    # direct sessions only for what needs one (liveness, LISTEN, duty locks).
    servers = [n for n, _ in seen]
    assert 0 < max(servers) <= POOL, servers
    direct_names = set().union(*(names for _, names in seen))
    # An executor's liveness session is named after the key that ends its id.
    kinds = {n.split(" ")[0] for n in direct_names}
    allowed = {"test", "conveyor-worker-liveness", "conveyor-worker-listen", "conveyor-executor-listen",
               "conveyor-executor-duties", "conveyor-api-listen", "conveyor-executor-liveness"}  # fmt: skip
    assert kinds <= allowed, direct_names
    assert {"conveyor-worker-liveness", "conveyor-executor-duties", "conveyor-executor-liveness"} <= kinds
    stats = _db_stats(bouncer, database)
    clients = [c for c in bouncer.admin("SHOW CLIENTS") if c["database"] == database]
    for proc in (executor, workers[survivor], api, workers[name]):
        assert _problems(proc) == [], proc.logs()
    per_process = Counter(n for _, names in seen[-1:] for n in names)
    span = db.execute(
        "SELECT extract(epoch FROM max(ended) - min(created))::float8 AS s FROM execution WHERE id = ANY(%s)",
        (echoes,),
    ).fetchone()
    print(
        f"\npgbouncer [{env['CONVEYOR__TRANSPORT']}]: {ECHOES + SLEEPERS + 1} executions through"
        f" PgBouncer 1.18 (pool {POOL}): {elapsed:.1f}s from the first request to the last completed"
        f" (the {ECHOES} echoes: {span['s'] if span else 0:.2f}s from the first created to the last ended);"
        f" {len(clients)} client connections on {max(servers)} server sessions at most;"
        f" {stats['total_xact_count']} transactions, {stats['total_query_count']} statements"
        f" ({int(stats['total_query_count']) // max(1, len(clients))} per client connection);"
        f" direct sessions at the end: {sorted(per_process)};"
        f" {in_flight} of the SDK's {ECHOES - 20} echoes still to complete at the kill;"
        f" the SIGKILLed worker's {len(lost)} running sleeps re-started"
        f" {recovery.total_seconds():.2f}s after the kill"
    )


@pytest.mark.parametrize("transport_kind", ["postgres"])  # what breaks does not depend on it
def test_prepared_statements_and_search_path_break_without_the_settings(
    procs: Procs, env: dict[str, str], db: Conn, db_url: str, bouncer: Bouncer
) -> None:
    # PgBouncer given as the database with no pooler setting: it refuses Conveyor's startup
    # options, and the error says what to set -- for a service and for the CLI alike.
    unsaid = {k: v for k, v in env.items() if k != "CONVEYOR__DATABASE__POOLER"}
    service = procs.start("executor", name="executor-no-pooler-setting", env=unsaid)
    cli = procs.run("executions", "list", env={**unsaid, "CONVEYOR__DATABASE__DIRECT_URL": env["DATABASE_URL"]})
    assert service.wait(60) != 0
    for output in (service.stderr(), cli.stderr):
        assert "unsupported startup parameter: options" in output, procs.logs() + describe(cli)
        assert "set database.pooler: transaction and database.direct_url" in output, procs.logs() + describe(cli)

    # No schema on the pooled sessions' search_path: refused at start, with the fix.
    refused = procs.start("executor", name="executor-no-search-path")
    assert refused.wait(60) != 0
    said = refused.stderr() + refused.stdout()
    assert "search_path" in said, refused.logs()
    assert "ALTER ROLE" in said, refused.logs()

    _serve_schema(db, db_url)
    bouncer.command("RECONNECT")  # the server sessions opened before the ALTER keep the old path
    prepared = {**env, "CONVEYOR__DATABASE__PREPARED_STATEMENTS": "true"}
    executor = start_executor(procs, prepared)
    worker = start_worker(procs, prepared, "wp", "--concurrency", "8")
    with psycopg.connect(bouncer.url(_dbname(db_url)), prepare_threshold=None, row_factory=dict_row) as pooled:
        for start in range(0, 200, 40):
            request_executions(pooled, [("core.echo", {"message": f"m{i}"}) for i in range(start, start + 40)])
            pooled.commit()

    def broken() -> list[str]:
        return [line for p in (executor, worker) for line in _problems(p) if "prepared statement" in line]

    lines = until(procs, broken, timeout=40)
    errors = Counter(
        m.group(0) for line in lines for m in re.finditer(r'prepared statement \\?"_pg3_\d+\\?" [a-z ]+', line)
    )
    print(f"\npgbouncer with prepared statements on: {dict(errors)}")


@pytest.mark.parametrize("transport_kind", ["postgres"])  # on rabbitmq the liveness session is the only direct one
def test_a_liveness_session_dropped_alone_keeps_its_grace_behind_the_pooler(
    procs: Procs, env: dict[str, str], db: Conn, db_url: str
) -> None:
    """The pool's server sessions do not count as the worker's (``<tag>``), but its listener
    goes direct with its ``[tag]``: its liveness session terminated alone, the worker takes
    its lock back within lock_grace, and what it runs is not run again."""
    _serve_schema(db, db_url)
    start_executor(procs, env)
    worker = start_worker(procs, env, "wl")
    [eid] = request_executions(db, [("core.sleep", {"seconds": 3})])
    until(procs, lambda: _statuses(db, [eid])["running"] == 1, timeout=30)
    terminate_liveness_session(db, worker_row(db, "wl")["id"])
    worker.wait_for_log("liveness session re-established", timeout=15)

    until(procs, lambda: _statuses(db, [eid])["completed"] == 1, timeout=20)
    assert [(a["worker_name"], a["outcome"]) for a in attempts(db, eid)] == [("wl", "completed")]
    assert worker_row(db, "wl")["status"] == "active"
    assert worker.returncode is None
    assert _problems(worker) == [], worker.logs()
