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

import re
import time
from collections.abc import Sequence
from typing import Any

import jsonschema
import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from conveyor.actions.registry import AdmissionPolicy
from conveyor.domain.errors import (
    ConflictError,
    ConveyorError,
    ExecutionNotFoundError,
    InvalidParametersError,
    InvalidPolicyError,
    NotFoundError,
    UnknownActionError,
)
from conveyor.domain.models import Attempt, Execution, ExecutionSummary, WorkerInfo, summary_fields
from conveyor.domain.status import ExecutionStatus
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q

_UNKNOWN_ACTION, _INVALID_PARAMETERS = "CVA01", "CVA02"
# admission_policy.target's CHECK, plus a length bound (a huge key would not fit its index).
_TARGET = re.compile(r"\*|[A-Za-z0-9_-]+|[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+")
_TARGET_MAX = 255


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


def valid_policy_target(target: str) -> bool:
    return isinstance(target, str) and len(target) <= _TARGET_MAX and _TARGET.fullmatch(target) is not None


def policy_spec(target: str, concurrency: int, parameters: Sequence[str], method: str) -> AdmissionPolicy:
    """The checked policy for ``set``; InvalidPolicyError says what is wrong."""
    if not valid_policy_target(target):
        raise InvalidPolicyError(
            f"invalid policy target {target!r}: give an action ref (pack.name), a pack (pack) or '*' (every action)"
        )
    params = tuple(parameters) if isinstance(parameters, list | tuple) else parameters  # else refused below
    try:
        return AdmissionPolicy(concurrency, params, method)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidPolicyError(f"invalid policy for {target}: {exc}") from None


def policy_not_found(target: str) -> NotFoundError:
    return NotFoundError(f"no admission policy for {target!r} (see `conveyor policies list`)")


def deletion_refused(current: dict[str, Any], defined: bool) -> ConflictError | None:
    """A policy from an action's definition follows that definition: deleting it would
    last only until the next change to it, so it is refused (an override is the way)."""
    if current["source"] == "metadata" and defined:
        target = current["target"]
        return ConflictError(
            f"the policy for {target} comes from the action's definition (policy=...): change the definition, "
            f"or override it with `conveyor policies set {target} --concurrency N`"
        )
    return None


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
    ) -> list[ExecutionSummary]:
        """Newest first, as summaries (no full parameters or result: ``get`` has them)."""
        params = {"statuses": [status] if status else None, "action": action, "worker": None, "since": None,
                  "until": None, "before": before, "limit": limit, "with_result": True}  # fmt: skip
        rows = self.conn.execute(Q["api_list_executions"], params).fetchall()
        return [ExecutionSummary(**{**summary_fields(r), "status": ExecutionStatus(r["status"])}) for r in rows]

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

    # -- admission policies (see docs/runbook.md#admission-policies) --------------------------

    def policies(self) -> list[dict[str, Any]]:
        """Every admission policy, most specific scope first, with slots held and waiters now."""
        return list(self.conn.execute(Q["list_policies"]).fetchall())

    def policy(self, target: str) -> dict[str, Any]:
        row = self.conn.execute(Q["get_policy"], {"target": target}).fetchone() if valid_policy_target(target) else None
        if row is None:
            raise policy_not_found(target)
        return dict(row)

    def set_policy(
        self, target: str, concurrency: int, parameters: Sequence[str] = (), method: str = "enqueue"
    ) -> dict[str, Any]:
        """Create or replace the operator policy for ``target`` (an action ref, a pack or
        '*'); it wins over the action's own ``policy=``. Returns it as stored. Waiters a
        higher limit now allows are admitted by the database in the same transaction."""
        spec = policy_spec(target, concurrency, parameters, method)
        with self.conn.transaction():
            self.conn.execute(Q["set_policy"], {"target": target, **spec.to_json()})
            return self.policy(target)

    def delete_policy(self, target: str) -> dict[str, Any]:
        """Delete the policy for ``target``; its waiters become schedulable. Deleting an
        operator's override of an action's own policy puts that one back (returned as
        ``restored``); deleting a policy that an action's definition declares is refused."""
        with self.conn.transaction():
            current = self.policy(target)
            defined = self.conn.execute(Q["policy_in_definition"], {"target": target}).fetchone() is not None
            refusal = deletion_refused(current, defined)
            if refusal is not None:
                raise refusal
            deleted = self.conn.execute(Q["delete_policy"], {"target": target}).fetchone()
            if deleted is None:  # deleted meanwhile by someone else
                raise policy_not_found(target)
            restored = None
            if defined and self.conn.execute(Q["restore_definition_policy"], {"target": target}).fetchone():
                restored = self.policy(target)
        return {**deleted, "restored": restored}

    def admission(self, execution_id: int) -> dict[str, Any] | None:
        """Where the execution stands in admission: ``state`` holding|waiting, ``policy``,
        ``group_key``, ``ahead`` (requests of its group before it), ``since``; None when no
        policy holds it (none applies, or it has ended)."""
        row = self.conn.execute(Q["admission_of"], {"id": execution_id}).fetchone()
        return dict(row) if row else None

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
