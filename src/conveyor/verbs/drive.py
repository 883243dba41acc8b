"""A verb written once, run by a sync and an async driver.

A state-changing verb is a generator: it yields the named queries it needs (a
:class:`Statement`), receives each one's answer, and returns its result. It never holds a
connection, so the SDK and CLI (sync) and the API (async) run the same body -- as psycopg
writes its wire protocol once as generators for both of its connection classes. Each verb
module of this package holds an aggregate's verbs; the adapters are one call:

    # sdk                                         # api route
    run(client.conn, executions.cancel(eid))      await run_async(conn, executions.cancel(eid))

What a driver does, identically: the whole verb in one transaction (a savepoint inside
the caller's, so a refusal leaves the caller's transaction usable); a statement's
``psycopg.Error`` thrown into the verb at its ``yield`` (where ``common.refusals()``
turns a verb's SQLSTATE into the ConveyorError a user can act on); and, for a verb made
by a factory, the whole transaction run again while the database rolls it back
(deadlock, serialization failure: ``database.verb_retries``). A verb's CPU work between
its statements (parsing and validating a document) is yielded too, as :func:`offload`:
the async driver runs it in a thread, so an API's event loop goes on answering meanwhile
(``/health/live`` while a large definition is checked).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, LiteralString, TypeVar

import psycopg
import structlog

from conveyor.store.db import AsyncConn, Conn, Row, rolled_back
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)
T = TypeVar("T")

Fetch = Literal["one", "all", "none"]
Params = Mapping[str, Any] | Sequence[Any] | None


@dataclass(frozen=True, slots=True)
class Statement:
    """One named query for a driver to execute: ``one`` answers its first row (or None),
    ``all`` its rows, ``none`` nothing."""

    name: str
    params: Params = None
    fetch: Fetch = "one"
    # In a savepoint of its own: a verb that catches this statement's error (thrown in at
    # its yield) may go on in the same transaction.
    savepoint: bool = False

    @property
    def sql(self) -> LiteralString:
        return Q[self.name]


@dataclass(frozen=True, slots=True)
class Work:
    """CPU work for a driver to run, sync in place, async in a thread: ``fn(*args)``,
    whose answer (or exception) the verb gets at its yield."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


Verb = Generator[Statement | Work, Any, T]
"""A verb: yields statements (and work), is sent their answers (Row | None, list[Row] or
None; work's return value)."""


def sql(name: str, params: Params = None, fetch: Fetch = "one", *, savepoint: bool = False) -> Statement:
    """The statement of named query ``name`` (a KeyError here names a missing query)."""
    if name not in Q:
        raise KeyError(f"no named query {name!r}")
    return Statement(name, params, fetch, savepoint)


def offload(fn: Callable[..., Any], *args: Any) -> Work:
    """``fn(*args)`` as a step of a verb: ``result = yield offload(prepare, documents)``."""
    return Work(fn, args)


def run(conn: Conn, verb: Verb[T] | Callable[[], Verb[T]], *, retries: int = 0) -> T:
    """Run ``verb`` on ``conn`` in a transaction (a savepoint in the caller's). A factory
    (``lambda: verbs.cancel(eid)``) is run again up to ``retries`` more times while the
    database rolls its transaction back."""
    for attempt in range(retries + 1):
        body = verb() if callable(verb) else verb
        try:
            with conn.transaction():
                return _drive_sync(conn, body)
        except psycopg.OperationalError as exc:
            if not callable(verb) or not rolled_back(exc) or attempt == retries:
                raise
            _log_retry(body, exc, attempt + 1, retries)
    raise AssertionError("unreachable")  # pragma: no cover (the loop returns or raises)


async def run_async(conn: AsyncConn, verb: Verb[T] | Callable[[], Verb[T]], *, retries: int = 0) -> T:
    """:func:`run` for an async caller (an API route's pool connection)."""
    for attempt in range(retries + 1):
        body = verb() if callable(verb) else verb
        try:
            async with conn.transaction():
                return await _drive_async(conn, body)
        except psycopg.OperationalError as exc:
            if not callable(verb) or not rolled_back(exc) or attempt == retries:
                raise
            _log_retry(body, exc, attempt + 1, retries)
    raise AssertionError("unreachable")  # pragma: no cover


def _drive_sync(conn: Conn, body: Verb[T]) -> T:
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = body.throw(error) if error is not None else body.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer, error = None, None
        if isinstance(step, Work):
            try:
                answer = step.fn(*step.args)
            except Exception as exc:  # raised at the verb's yield, as if it had called fn
                error = exc
            continue
        try:
            if step.savepoint:
                with conn.transaction():
                    answer = _fetch_sync(conn.execute(step.sql, step.params), step.fetch)
            else:
                answer = _fetch_sync(conn.execute(step.sql, step.params), step.fetch)
        except psycopg.Error as exc:
            error = exc


def _fetch_sync(cursor: psycopg.Cursor[Row], fetch: Fetch) -> Row | list[Row] | None:
    return cursor.fetchone() if fetch == "one" else cursor.fetchall() if fetch == "all" else None


async def _drive_async(conn: AsyncConn, body: Verb[T]) -> T:
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = body.throw(error) if error is not None else body.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer, error = None, None
        if isinstance(step, Work):
            try:
                answer = await asyncio.to_thread(step.fn, *step.args)
            except Exception as exc:
                error = exc
            continue
        try:
            if step.savepoint:
                async with conn.transaction():
                    answer = await _fetch_async(await conn.execute(step.sql, step.params), step.fetch)
            else:
                answer = await _fetch_async(await conn.execute(step.sql, step.params), step.fetch)
        except psycopg.Error as exc:
            error = exc


async def _fetch_async(cursor: psycopg.AsyncCursor[Row], fetch: Fetch) -> Row | list[Row] | None:
    if fetch == "one":
        return await cursor.fetchone()
    return await cursor.fetchall() if fetch == "all" else None


def _log_retry(body: Verb[Any], exc: psycopg.Error, retry: int, retries: int) -> None:
    log.info(
        "verb rolled back by the database (deadlock or serialization failure); running it again",
        verb=getattr(body, "__name__", "verb"),
        sqlstate=exc.sqlstate,
        retry=retry,
        retries=retries,
    )
