"""The Python SDK: request executions (inside your own transaction if you pass your
connection), read them, wait for them.

    import psycopg
    from conveyor.sdk import request_execution

    with psycopg.connect(url) as conn:          # your transaction
        conn.execute("INSERT INTO orders ...")
        execution_id = request_execution(conn, "core.echo", {"message": "hi"})
    # the execution exists if and only if the transaction committed
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jsonschema
import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    ExecutionNotFoundError,
    InvalidParametersError,
    UnknownActionError,
)
from conveyor.domain.models import Attempt, Execution, WorkerInfo
from conveyor.domain.status import ExecutionStatus
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q

_UNKNOWN_ACTION, _INVALID_PARAMETERS = "CVA01", "CVA02"


def _schema_of(conn: psycopg.Connection[Any], action_ref: str, schema: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.SQL("SELECT parameters_schema FROM {}.action WHERE ref = %s").format(sql.Identifier(schema)),
            (action_ref,),
        )
        row = cur.fetchone()
    if row is None:
        raise UnknownActionError(action_ref)
    return dict(row["parameters_schema"])


def validate_parameters(action_ref: str, parameters_schema: dict[str, Any], parameters: Any) -> None:
    cls = jsonschema.validators.validator_for(parameters_schema)
    errors = sorted(cls(parameters_schema).iter_errors(parameters), key=lambda e: list(e.path))
    if errors:
        raise InvalidParametersError(
            action_ref, [f"{'.'.join(str(p) for p in e.path) or 'parameters'}: {e.message}" for e in errors]
        )


def request_execution(
    conn: psycopg.Connection[Any],
    action_ref: str,
    parameters: dict[str, Any] | None = None,
    *,
    schema: str = "conveyor",
) -> int:
    """Create an execution in ``requested`` within ``conn``'s current transaction."""
    params = parameters or {}
    validate_parameters(action_ref, _schema_of(conn, action_ref, schema), params)
    try:
        # A savepoint: a refusal by the database (CVA01/CVA02) is raised as a ConveyorError
        # and must leave the caller's transaction usable, as a client-side refusal does.
        with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(
                sql.SQL("SELECT {}.request_execution(%s, %s)").format(sql.Identifier(schema)),
                (action_ref, Jsonb(params)),
            )
            row = cur.fetchone()
    except psycopg.Error as exc:
        raise _translate(exc, action_ref) from None
    assert row is not None
    return int(row[0])


def request_executions(
    conn: psycopg.Connection[Any], requests: Sequence[tuple[str, dict[str, Any]]], *, schema: str = "conveyor"
) -> list[int]:
    """Batch form of :func:`request_execution`: one statement for all rows."""
    schemas: dict[str, dict[str, Any]] = {}
    for ref, params in requests:
        if ref not in schemas:
            schemas[ref] = _schema_of(conn, ref, schema)
        validate_parameters(ref, schemas[ref], params)
    # A savepoint inside the caller's transaction (or a transaction of its own under
    # autocommit); the search path is switched for the statement and restored.
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT current_setting('search_path')")
        saved = cur.fetchone()
        cur.execute("SELECT set_config('search_path', %s, true)", (schema,))
        cur.execute(
            Q["request_many"], {"refs": [r for r, _ in requests], "parameters": [Jsonb(p) for _, p in requests]}
        )
        ids = [int(r[0]) for r in cur.fetchall()]
        cur.execute("SELECT set_config('search_path', %s, true)", (saved[0] if saved else "",))
        cur.execute("SELECT pg_notify(%s, '')", (f"{schema}.requested",))
    return ids


def _translate(exc: psycopg.Error, action_ref: str) -> ConveyorError | psycopg.Error:
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == _UNKNOWN_ACTION:
        return UnknownActionError(action_ref)
    if exc.sqlstate == _INVALID_PARAMETERS:
        return InvalidParametersError(action_ref, [message.split(": ", 1)[-1]])
    return exc


translate_request_error = _translate


def _execution(row: dict[str, Any], attempts: tuple[Attempt, ...] = ()) -> Execution:
    return Execution(**{**row, "status": ExecutionStatus(row["status"])}, attempts=attempts)


class Client:
    """A synchronous client for scripts and the CLI."""

    def __init__(self, url: str, schema: str = "conveyor") -> None:
        self.url = url
        self.schema = schema
        self.conn = connect_sync(url, schema, application_name="conveyor-client", autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, action_ref: str, parameters: dict[str, Any] | None = None) -> int:
        with self.conn.transaction():
            return request_execution(self.conn, action_ref, parameters, schema=self.schema)

    def get(self, execution_id: int, *, with_attempts: bool = True) -> Execution:
        row = self.conn.execute(Q["get_execution"], {"id": execution_id}).fetchone()
        if row is None:
            raise ExecutionNotFoundError(execution_id)
        attempts: tuple[Attempt, ...] = ()
        if with_attempts:
            rows = self.conn.execute(Q["get_attempts"], {"id": execution_id}).fetchall()
            attempts = tuple(Attempt(**r) for r in rows)
        return _execution(row, attempts)

    def executions(
        self, *, status: str | None = None, action: str | None = None, limit: int = 50, before: int | None = None
    ) -> list[Execution]:
        rows = self.conn.execute(
            Q["list_executions"], {"status": status, "action": action, "limit": limit, "before": before}
        ).fetchall()
        return [_execution(r) for r in rows]

    def workers(self) -> list[WorkerInfo]:
        return [WorkerInfo(**r) for r in self.conn.execute(Q["list_workers"]).fetchall()]

    def cordon(self, name: str, cordoned: bool = True) -> int:
        row = self.conn.execute(Q["set_cordon"], {"name": name, "cordoned": cordoned}).fetchone()
        if row is None:
            raise ConveyorError(f"no worker named {name!r}")
        return int(row["id"])

    def drain(self, name: str) -> int:
        """Cordon the worker and hand its not-yet-started work to others; what it runs
        finishes there. Returns how many executions were handed back."""
        with self.conn.transaction():
            worker_id = self.cordon(name)
            self.conn.execute(Q["lock_assignment"])  # no dispatch to it can slip in after this
            back = self.conn.execute(Q["hand_back_scheduled"], {"worker": worker_id}).fetchall()
            if back:
                self.conn.execute("SELECT pg_notify(%s, '')", (f"{self.schema}.requested",))
        return len(back)

    def actions(self) -> list[dict[str, Any]]:
        return list(self.conn.execute(Q["list_actions"]).fetchall())

    def action(self, ref: str) -> dict[str, Any]:
        row = self.conn.execute(Q["get_action"], {"ref": ref}).fetchone()
        if row is None:
            raise UnknownActionError(ref)
        return dict(row)

    def cancel(self, execution_id: int, *, by: str = "sdk") -> str:
        """Cancel an execution; returns its new status: ``cancelled`` (it had not started),
        or ``canceling`` while its worker stops it (then ``cancelled``). A finished one
        raises ConflictError."""
        with self.conn.transaction():
            row = self.conn.execute(Q["cancel_execution"], {"id": execution_id, "by": by}).fetchone()
            if row is None:
                raise ExecutionNotFoundError(execution_id)
            if row["now"] is None:
                raise ConflictError(f"execution {execution_id} is {row['was']}: nothing to cancel")
            if row["now"] == "cancelled":  # waiters are told now
                self.conn.execute("SELECT pg_notify(%s, %s)", (f"{self.schema}.completed", str(execution_id)))
            elif row["worker"] is not None:  # its worker looks now (it also checks every poll)
                self.conn.execute("SELECT pg_notify(%s, '')", (f"{self.schema}.worker.{row['worker']}",))
        return str(row["now"])

    def wait(self, execution_id: int, timeout: float | None = None) -> Execution:
        """Block until the execution is terminal (woken by NOTIFY, re-checked every second)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"{self.schema}.completed")))
        try:
            while True:
                execution = self.get(execution_id, with_attempts=False)
                if execution.status.is_terminal:
                    return self.get(execution_id)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ConveyorError(f"execution {execution_id} is still {execution.status} after {timeout:g}s")
                wait = 1.0 if remaining is None else min(1.0, remaining)
                for _ in self.conn.notifies(timeout=wait, stop_after=1):
                    pass
        finally:
            self.conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(f"{self.schema}.completed")))
