"""Connections with the schema on the search path, so named queries and the seeds'
runbook SQL run unqualified."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import psycopg
import structlog
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from conveyor.domain.errors import ConveyorError
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)

# The connection types of the whole code base: every connection is made with dict rows
# (connect, connect_sync, make_pool), so a row is a dict keyed by column name.
Row = dict[str, Any]
Conn = psycopg.Connection[Row]
AsyncConn = psycopg.AsyncConnection[Row]
Pool = AsyncConnectionPool[AsyncConn]

# Keepalives so that a session whose peer vanished (host down, link cut) is
# noticed by both ends in seconds rather than after the kernel's 2-hour default.
KEEPALIVES: Mapping[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}


# database.reconnect_interval's default (config_connections.py), for the pools and
# listeners made outside the services (tests, CLI commands).
RECONNECT_INTERVAL = 0.5
# The wait for a connection of the pools made outside the services: psycopg_pool's own
# default, unchanged for them; the services pass database.pool_timeout.
POOL_TIMEOUT = 30.0

# This process's tag, carried by every session it opens (application_name "... [tag]")
# and recorded by a worker when it registers (migration 0022). A process that dies
# loses all its sessions at once; a liveness session dropped alone leaves the others:
# "lock gone and no session of that tag left" is a dead worker, judged without waiting
# out lock_grace. Random, not host and pid: a restarted container reuses both. 12
# lowercase hex digits: what the sweep's pattern (recovery.sql) extracts.
PROCESS_TAG = secrets.token_hex(6)


def tagged(application_name: str, *, pooled: bool = False) -> str:
    """``application_name`` with this process's tag (PostgreSQL keeps 63 bytes of it:
    the name is shortened so the tag survives).

    ``pooled``: a connection through a transaction pooler (database.pooler). The server
    session behind it is not this process's: PgBouncer lends it to any client for one
    transaction and sets on it the application_name of whichever client used it last, so
    it may show a dead process's tag, or none of a live one's. Its tag is written
    ``<tag>``, which the sweep's pattern (``[tag]``) ignores: an operator still reads in
    pg_stat_activity which process used a server session last, and the sweep judges a
    process by its direct sessions alone (liveness, listener, duty locks)."""
    suffix = f" <{PROCESS_TAG}>" if pooled else f" [{PROCESS_TAG}]"
    return application_name[: 63 - len(suffix)] + suffix


# How long a session may sit idle inside a transaction before the server ends it (and
# releases its locks): a client that vanished or froze between two statements of one.
IDLE_IN_TRANSACTION = 60.0
# A session the server ended: lost (OperationalError), or ended for sitting idle in a
# transaction -- SQLSTATE 25P03, which psycopg raises as an InternalError. Both mean the
# same to the process: reconnect (the pool does) and try again or leave it to recovery.
SESSION_ENDED = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)


def conninfo_kwargs(
    schema: str, application_name: str, *, pooled: bool = False, idle_timeout: float = IDLE_IN_TRANSACTION
) -> dict[str, Any]:
    """Connection parameters. ``pooled``: through a transaction pooler, which refuses the
    ``options`` startup parameter (PgBouncer: "unsupported startup parameter: options"),
    or drops it when told to ignore it: the pooled sessions' search_path and timeouts
    must come from the server (ALTER ROLE ... SET; check_pooled_sessions verifies)."""
    if pooled:
        return {"application_name": tagged(application_name, pooled=True), **KEEPALIVES}
    # Server side: a session whose client vanished mid-transaction (a partition between a
    # claim and its COMMIT) must not hold its row locks for the kernel's 2 hours; nor one
    # whose client froze there (a paused VM, SIGSTOP: its kernel still answers keepalives).
    # A worker passes its self_fence_after (app.serve): the lock of a frozen worker's open
    # transaction (live output's share lock on its execution, say) is gone before the
    # executors recover the execution, whose sweep skips locked rows.
    server = (
        f"-c search_path={schema} -c idle_in_transaction_session_timeout={max(1, round(idle_timeout * 1000))}ms"
        " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
    )
    return {
        "options": server,
        "application_name": tagged(application_name),
        **KEEPALIVES,
    }


async def connect(
    url: str, schema: str, application_name: str = "conveyor", autocommit: bool = False
) -> psycopg.AsyncConnection[Row]:
    return await psycopg.AsyncConnection.connect(
        url, autocommit=autocommit, row_factory=dict_row, **conninfo_kwargs(schema, application_name)
    )


def connect_sync(
    url: str, schema: str, application_name: str = "conveyor", autocommit: bool = False
) -> psycopg.Connection[Row]:
    return psycopg.Connection.connect(
        url, autocommit=autocommit, row_factory=dict_row, **conninfo_kwargs(schema, application_name)
    )


def make_pool(
    url: str,
    schema: str,
    application_name: str,
    max_size: int,
    *,
    pooled: bool = False,
    prepare_threshold: int | None = 5,
    idle_timeout: float = IDLE_IN_TRANSACTION,
    reconnect_interval: float = RECONNECT_INTERVAL,
    timeout: float = POOL_TIMEOUT,
) -> AsyncConnectionPool[psycopg.AsyncConnection[Row]]:
    """The process's pool. ``pooled``/``prepare_threshold``: see conninfo_kwargs and
    DatabaseSettings.prepare_threshold (database.pooler, database.prepared_statements).
    ``reconnect_interval``, ``timeout``: database.reconnect_interval, database.pool_timeout."""
    return AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        # The default wait for a connection (the API passes its own, api.database_timeout):
        # a loop whose pass cannot get one in this time logs it and tries again, rather
        # than sitting out psycopg_pool's 30 s.
        timeout=timeout,
        kwargs={
            "row_factory": dict_row,
            "prepare_threshold": prepare_threshold,
            **conninfo_kwargs(schema, application_name, pooled=pooled, idle_timeout=idle_timeout),
        },
        connection_class=psycopg.AsyncConnection[Row],
        # The pool retries a lost connection with a doubling delay (1, 2, 4 s...) until
        # reconnect_timeout, then gives up and tries again only when a new request finds
        # no connection. With its 300 s default the next try came up to a minute after the
        # database was back; with 5 s, a worker whose loops all waited inside the pool
        # sat idle up to ~22 s (issue 25). Each attempt now gives up after
        # reconnect_interval, and _keep_reconnecting starts the next one at once: a
        # try at least every reconnect_interval, however long the outage.
        reconnect_timeout=reconnect_interval,
        reconnect_failed=_keep_reconnecting,
        # No check on checkout (it would cost a round trip on every use): a connection
        # broken by a database restart fails its statement, the caller's loop retries,
        # and the pool discards the broken connection when it comes back.
    )


async def _keep_reconnecting(pool: Pool) -> None:
    """The pool gave up one reconnection attempt (reconnect_timeout): while it holds fewer
    connections than its minimum -- all of them lost, the database down -- start another
    at once instead of waiting for the next request. ``check()`` is the pool's public door
    to that (it grows a pool that lacks connections); with none idle it tests nothing."""
    if pool.closed or pool.get_stats().get("pool_size", 0) >= pool.min_size:
        return
    await pool.check()


async def check_pool_url(url: str, schema: str, application_name: str) -> None:
    """One connection as the pool makes them (without database.pooler), before the pool
    opens: a pooler that refuses the startup options (database.url through PgBouncer,
    database.pooler left at none) is reported at once with the fix, not as the pool's
    timeout 30 s later. Any other failure is left to the pool, which waits for a server
    that is down or starting."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            url, connect_timeout=5, **conninfo_kwargs(schema, application_name)
        )
    except psycopg.OperationalError as exc:
        if hint := pooler_hint(exc):
            raise ConveyorError(f"database.url refused Conveyor's startup options ({str(exc).strip()}){hint}") from None
        return
    await conn.close()


def pooler_hint(exc: BaseException) -> str:
    """What to do when a connection pooler refused Conveyor's startup options (PgBouncer:
    "unsupported startup parameter: options"); empty for any other error."""
    if "unsupported startup parameter" not in str(exc):
        return ""
    return (
        ": it goes through a connection pooler; set database.pooler: transaction and database.direct_url "
        "(DATABASE_DIRECT_URL) to PostgreSQL itself (docs/deployment.md, Connection poolers)"
    )


async def check_pooled_sessions(pool: Pool, schema: str) -> None:
    """Behind a transaction pooler the pool's sessions get their search_path from the
    server (the role's or database's default, or the pooler's connect_query), not from
    Conveyor: refuse to start when it does not lead to the schema -- every named query
    would fail, or worse, find another schema's tables of the same names."""
    async with pool.connection() as conn:
        row = await (await conn.execute(Q["pooled_session_settings"])).fetchone()
    assert row is not None
    if row["schema"] != schema:
        raise ConveyorError(
            f"database.pooler is 'transaction', and the sessions behind database.url have search_path "
            f"{row['search_path']!r} (current schema {row['schema']!r}), not Conveyor's schema {schema!r}: "
            f"a pooler cannot pass it on connection; set it on the server, e.g. "
            f"ALTER ROLE {row['role']} IN DATABASE {row['database']} SET search_path = {schema}, public"
        )
    if row["idle_timeout"] == "0":
        log.warning(
            "the pooled sessions have no idle_in_transaction_session_timeout: a transaction left open by a "
            "client that vanished holds its locks until the pooler drops it (set it on the server, e.g. "
            "ALTER ROLE ... SET idle_in_transaction_session_timeout = '60s', and PgBouncer's "
            "idle_transaction_timeout)",
        )


def channel(schema: str, topic: str, worker_id: int | None = None) -> str:
    """The NOTIFY channel of a wake-up topic (``store.wakeups.Topic``), as the SQL's
    ``wake()`` names it: the schema first, so two installations in one database do not
    wake each other; a worker's own channel (``Topic.WORKER``) ends with its id."""
    return f"{schema}.{topic}" if worker_id is None else f"{schema}.{topic}.{worker_id}"


def listen_statement(channel_name: str) -> sql.Composed:
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel_name))


# The server's own refusal of every new connection while it shuts down, starts or
# recovers (SQLSTATE 57P03). libpq gives a failed connection no SQLSTATE, only text.
# The last is a standby with hot_standby=off: with a multi-host URL, during a failover
# it is all there is until it is promoted -- it will take connections then.
_RESTARTING = (
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
)
# Every connection slot taken (53300): the server is up and will take one later.
_FULL = ("sorry, too many clients already", "remaining connection slots are reserved")


def server_restarting(exc: BaseException) -> bool:
    """The server itself answered that it is shutting down, starting or recovering."""
    return isinstance(exc, psycopg.OperationalError) and any(s in str(exc) for s in _RESTARTING)


def refused_for_good(exc: BaseException) -> bool:
    """The server answered a connection and refused it for a reason waiting does not fix
    (authentication, pg_hba, no such database or role). Everything else may pass: no
    answer, a refused or reset TCP connection, a server restarting or full."""
    text = str(exc)
    return (
        isinstance(exc, psycopg.OperationalError)
        and "FATAL:" in text
        and not server_restarting(exc)
        and not any(s in text for s in _FULL)
    )


# The server rolled the transaction back to break a deadlock (40P01) or a serialization
# conflict (40001; the schema's functions raise it too, for a race they lost). psycopg
# makes both direct subclasses of OperationalError, not of errors.TransactionRollback
# (40000), so they are named here rather than matched by that class.
_ROLLED_BACK = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def rolled_back(exc: BaseException) -> bool:
    """The database rolled the transaction back (deadlock, serialization failure): it is
    up, and doing the same again is the cure."""
    return isinstance(exc, _ROLLED_BACK)


def log_operational(logger: Any, what: str, exc: psycopg.Error, **fields: Any) -> None:
    """Log a pass or duty that an OperationalError (or a session ended, SESSION_ENDED) ended, which its loop retries.

    A deadlock or serialization failure is an OperationalError too, but the database is
    up and the retry is the cure: calling it "unreachable" sends an operator looking
    for an outage that was not there. Its sqlstate tells which of the two it was."""
    error = str(exc).strip()
    if rolled_back(exc):
        logger.info(
            f"{what} rolled back by the database (deadlock or serialization failure); retrying",
            sqlstate=exc.sqlstate,
            error=error,
            **fields,
        )
    elif isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout) or "idle-in-transaction timeout" in error:
        # Not an outage: this process stalled (SIGSTOP, a paused VM) inside a transaction,
        # and the server ended the session to free its locks (idle_in_transaction_session_timeout).
        logger.warning(
            f"{what} failed; the server ended its session, idle in a transaction past its bound "
            "(this process was stalled)",
            error=error,
            **fields,
        )
    else:
        logger.warning(f"{what} failed; database unreachable", error=error, **fields)
