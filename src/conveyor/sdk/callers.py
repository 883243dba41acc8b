"""A verb run inside a caller's own transaction, on the caller's own connection (the SDK
functions that take one: ``emit_event(conn, ...)``), where a :class:`conveyor.sdk.Client`'s
connection is Conveyor's: that connection may have no search_path to the schema, may
answer tuples, and may be idle outside a transaction."""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from conveyor.verbs.drive import Verb, run, sql

T = TypeVar("T")


def in_callers_transaction(conn: psycopg.Connection[Any], schema: str, verb: Verb[T]) -> T:
    """``verb`` in a savepoint of the caller's transaction: a refusal rolls back to it and
    leaves the transaction usable, and what the verb did commits (or not) with the rest."""
    # psycopg's transaction() on an idle connection that is not autocommit would BEGIN and
    # COMMIT one of its own -- committing what the caller may yet roll back -- so the
    # caller's transaction is begun first, as its next statement would begin it.
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        conn.execute("SELECT 1")
    rows = conn.row_factory  # the verbs read their answers by column name
    conn.row_factory = dict_row
    try:
        return run(conn, in_schema(schema, verb))
    finally:
        conn.row_factory = rows


def in_schema(schema: str, verb: Verb[T]) -> Verb[T]:
    """``verb`` with the search_path at ``schema`` (its statements name no schema), the
    caller's put back after it; a refusal's rollback to the savepoint puts it back too."""
    entered = yield sql("enter_schema", {"schema": schema})
    result = yield from verb
    if entered["was"] is not None:
        yield sql("leave_schema", {"was": entered["was"]})
    return result
