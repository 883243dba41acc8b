"""Builders shared by the integration tests: rows made as the services make them (or by
hand, where a test needs a state no service makes), the services' pieces set up for one
test, and the small queries tests read the rows back with. One definition each; the
``conn``, ``pool`` and ``transport`` fixtures are in the conftest modules.

Workers are rows (and, for the lock fast path, an advisory lock held on a connection of
the test); "dying" is a stale heartbeat or a released lock."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from conveyor.config import Settings
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus as S
from conveyor.executor.recovery import Recovery
from conveyor.executor.scheduler import Scheduler
from conveyor.sdk import Client
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.transport.postgres import PostgresTransport

Conn = psycopg.Connection[dict[str, Any]]
Pool = AsyncConnectionPool[Any]

SCHEMA = "conveyor"

# Parameters valid for the core actions, for tests that need one request of any of them.
PARAMETERS: dict[str, dict[str, Any]] = {"core.sleep": {"seconds": 1}, "core.echo": {"message": "hi"}}


# -- the services' pieces -------------------------------------------------------------------


def recovery(pool: Pool, transport: PostgresTransport, **sections: dict[str, Any]) -> Recovery:
    """The executor's recovery duties, with ``sections`` of settings (``executor={...}``)."""
    return Recovery(pool, Settings(**sections))


def scheduler(
    pool: Pool,
    transport: PostgresTransport,
    executor_id: str = "ex-test",
    *,
    batch_size: int = 100,
    no_worker_grace: float = 0,
) -> Scheduler:
    """A scheduling round of replica ``executor_id`` (no grace: places at once)."""
    return Scheduler(
        pool,
        executor_id=executor_id,
        batch_size=batch_size,
        no_worker_grace=no_worker_grace,
        unplaceable_check_interval=0,
    )


# -- workers --------------------------------------------------------------------------------


def add_worker(
    conn: Conn,
    name: str,
    capacity: int = 10,
    *,
    heartbeat: str | None = "now()",
    status: str = "active",
    runtimes: str = "{python,shell}",
    actions: str = "{core.echo,core.noop,core.sleep}",
    stale_after: float = 30,
    lock_epoch: str = "NULL",
    lock_grace: float = 0,
    updated: str = "now()",
) -> int:
    """A worker row. ``heartbeat``, ``lock_epoch`` and ``updated`` are SQL expressions
    (``heartbeat`` None: never heartbeated). ``lock_epoch`` NULL means "no liveness lock to
    check" (only the heartbeat decides); pg_postmaster_start_time() or stamp_server_epoch()
    means its lock must be held. ``lock_grace`` 0: a missing lock is fatal at the first
    sweep that sees it."""
    return int(
        conn.execute(
            "INSERT INTO worker (name, status, runtimes, actions, capacity, last_heartbeat, stale_after, lock_epoch,"
            f" lock_grace, updated) VALUES (%s, %s, %s, %s, %s, {heartbeat or 'NULL'}, %s, {lock_epoch}, %s,"
            f" {updated}) RETURNING id",
            (name, status, runtimes, actions, capacity, stale_after, lock_grace),
        ).fetchone()["id"]
    )


def kill(conn: Conn, worker: int) -> None:
    """The worker stops heartbeating (long enough ago to be stale)."""
    conn.execute("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (worker,))


def worker_status(conn: Conn, worker: int) -> str:
    return str(conn.execute("SELECT status FROM worker WHERE id = %s", (worker,)).fetchone()["status"])


async def make_worker(pool: Pool, name: str) -> int:
    """A live worker (its lock taken under this server: ``lock_grace`` 1 s, a long
    staleness bound), made on the pool."""
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                "INSERT INTO worker (name, runtimes, actions, capacity, stale_after, lock_grace, lock_epoch,"
                " last_heartbeat) VALUES (%s, '{python}', '{core.noop}', 10, 3600, 1, pg_postmaster_start_time(),"
                " now()) RETURNING id",
                (name,),
            )
        ).fetchone()
    assert row is not None
    return int(row["id"])


# -- executions -----------------------------------------------------------------------------


def request(conn: Conn, n: int = 1, ref: str = "core.noop", parameters: dict[str, Any] | None = None) -> list[int]:
    """``n`` requests of ``ref``, as the SDK makes them."""
    return [
        int(conn.execute("SELECT request_execution(%s, %s) AS id", (ref, Jsonb(parameters or {}))).fetchone()["id"])
        for _ in range(n)
    ]


def request_one(conn: Conn, ref: str = "core.noop") -> int:
    """One request of ``ref`` with valid parameters."""
    return request(conn, 1, ref, PARAMETERS.get(ref, {}))[0]


async def make_dispatches(conn: Any, worker: int, count: int = 1) -> list[int]:
    """Executions moved requested -> scheduling -> scheduled onto ``worker`` (attempt 1),
    as the scheduler does, in ``conn``'s transaction."""
    rows = await (
        await conn.execute(
            "INSERT INTO execution (action_ref) SELECT 'core.noop' FROM generate_series(1, %s) RETURNING id", (count,)
        )
    ).fetchall()
    ids = [r["id"] for r in rows]
    await conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = ANY(%s)", (ids,))
    await conn.execute(Q["assign"], {"ids": ids, "workers": [worker] * count, "executor": "t"})
    return ids


def row(conn: Conn, eid: int) -> dict[str, Any]:
    """The execution row, with the database's ``now()`` as ``db_now``."""
    found = conn.execute("SELECT *, now() AS db_now FROM execution WHERE id = %s", (eid,)).fetchone()
    assert found is not None
    return dict(found)


def rows(conn: Conn, ids: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """The execution rows by id: of ``ids``, or all."""
    found = conn.execute(
        "SELECT * FROM execution WHERE %s::bigint[] IS NULL OR id = ANY(%s) ORDER BY id", (ids, ids)
    ).fetchall()
    return {r["id"]: r for r in found}


def status(conn: Conn, eid: int) -> str:
    return str(row(conn, eid)["status"])


async def execution(pool: Pool, eid: int) -> dict[str, Any]:
    """The execution row, read on the pool."""
    async with pool.connection() as conn:
        found = await (await conn.execute("SELECT * FROM execution WHERE id = %s", (eid,))).fetchone()
    assert found is not None
    return dict(found)


def attempts(conn: Conn, eid: int) -> list[dict[str, Any]]:
    return list(
        conn.execute("SELECT * FROM execution_attempt WHERE execution = %s ORDER BY attempt", (eid,)).fetchall()
    )


def age_scheduled(conn: Conn, ids: list[int], seconds: float) -> None:
    """Move ``scheduled`` back in time (the execution guard stamps ``updated`` only)."""
    with conn.transaction():
        conn.execute("ALTER TABLE execution DISABLE TRIGGER execution_guard")
        conn.execute(
            "UPDATE execution SET scheduled = now() - make_interval(secs => %s) WHERE id = ANY(%s)", (seconds, ids)
        )
        conn.execute("ALTER TABLE execution ENABLE TRIGGER execution_guard")


def policy(
    conn: Conn, target: str, concurrency: int, parameters: tuple[str, ...] = (), method: str = "enqueue"
) -> None:
    """A concurrency policy on ``target`` (an action or a pack), as ``conveyor policy set`` makes it."""
    conn.execute(Q["set_policy"], {"target": target, "concurrency": concurrency, "parameters": list(parameters),
                                   "method": method})  # fmt: skip


def holders(conn: Conn) -> list[int]:
    """The executions holding an admission slot."""
    return [r["execution"] for r in conn.execute("SELECT execution FROM execution_admission_slot ORDER BY execution")]


def waiters(conn: Conn) -> list[int]:
    """The executions waiting in an admission queue, in order."""
    return [r["execution"] for r in conn.execute("SELECT execution FROM execution_admission_queue ORDER BY execution")]


def client_of(conn: Conn) -> Client:
    """An SDK client on the same database (it opens its own session)."""
    return Client(conn.info.dsn, SCHEMA)


# -- the worker's fenced writes -------------------------------------------------------------


def claim(conn: Conn, worker: int, limit: int = 100) -> list[dict[str, Any]]:
    """The worker starts what was dispatched to it: scheduled -> running."""
    return list(conn.execute(Q["claim_scheduled"], {"worker": worker, "limit": limit}).fetchall())


def finish_all(
    conn: Conn, worker: int, done: list[tuple[int, int]], status: str = "completed", error: str | None = None
) -> list[int]:
    """The worker's results for ``done`` (execution, attempt) pairs; the ids it wrote."""
    found = conn.execute(
        Q["finish"],
        {
            "worker": worker,
            "ids": [eid for eid, _ in done],
            "attempts": [attempt for _, attempt in done],
            "statuses": [status] * len(done),
            "outcomes": [status] * len(done),
            "delays": [None] * len(done),
            "results": [Jsonb({"succeeded": status == "completed", "error": error})] * len(done),
            "errors": [error] * len(done),
        },
    ).fetchall()
    return [r["id"] for r in found]


def finish(conn: Conn, worker: int, eid: int, attempt: int, status: str = "completed") -> list[int]:
    """The worker's result for one attempt, which names the worker (``by``) so a test can
    tell whose write won; a failure's error is "late"."""
    found = conn.execute(
        Q["finish"],
        {
            "worker": worker,
            "ids": [eid],
            "attempts": [attempt],
            "statuses": [status],
            "outcomes": [status],
            "delays": [None],
            "results": [Jsonb({"succeeded": status == "completed", "by": worker})],
            "errors": [None if status == "completed" else "late"],
        },
    ).fetchall()
    return [r["id"] for r in found]


def release(conn: Conn, worker: int, eid: int, attempt: int) -> list[dict[str, Any]]:
    """What a worker does with an execution it stopped: running -> requested, fenced."""
    decisions = Decisions()
    decisions.add({"id": eid, "attempt": attempt}, Decision(S.REQUESTED, None, "worker lost"))
    params = decisions.params(AttemptEnd.WORKER_LOST, by="worker", from_statuses=(S.RUNNING,), worker=worker)
    return list(conn.execute(Q["resolve_attempts"], params).fetchall())


async def start_on(conn: Conn, pool: Pool, transport: PostgresTransport, worker: int, eid: int) -> int:
    """Dispatch ``eid`` (the only live worker must be ``worker``) and start it there; its attempt."""
    assert (await scheduler(pool, transport).run_round()).dispatched >= 1
    current = row(conn, eid)
    assert (current["status"], current["worker"]) == ("scheduled", worker)
    started = [r for r in claim(conn, worker) if r["id"] == eid]
    assert len(started) == 1
    return int(started[0]["attempt"])


async def run_one(conn: Conn, pool: Pool, transport: PostgresTransport, worker: int, executor: str = "ex-a") -> int:
    """One scheduling round by ``executor``, then the worker starts what it got; the one it started."""
    await scheduler(pool, transport, executor).run_round()
    (started,) = claim(conn, worker)
    return int(started["id"])


# -- what the server shows ------------------------------------------------------------------


def waiting_on_a_lock(conn: Conn, pid: int) -> bool:
    """Whether the server shows session ``pid`` waiting for a lock."""
    row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"


def finished(conn: Conn, status: str = "completed", days: float = 40, parent: int | None = None) -> int:
    """A finished execution (one attempt) that ended ``days`` ago, for retention tests. Made
    with triggers off: the guarded path only inserts requested rows and cannot backdate."""
    conn.execute("SET session_replication_role = replica")
    try:
        eid = int(
            conn.execute(
                "INSERT INTO execution (id, action_ref, status, parent, attempt, created, updated, ended)"
                " VALUES (nextval('execution_id_seq'), 'core.noop', %s, %s, 1,"
                " now() - make_interval(days => %s), now() - make_interval(days => %s),"
                " now() - make_interval(days => %s)) RETURNING id",
                (status, parent, days, days, days),
            ).fetchone()["id"]
        )
        conn.execute(
            "INSERT INTO execution_attempt (execution, attempt, worker_name, outcome) VALUES (%s, 1, 'w', %s)",
            (eid, status),
        )
    finally:
        conn.execute("RESET session_replication_role")
    return eid
