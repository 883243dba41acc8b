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

import json
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from conveyor.config.connections import VERB_RETRIES
from conveyor.domain.delays import DelayError, check_aware, check_delay
from conveyor.domain.documents import DEFAULT_LIMITS, Limits
from conveyor.domain.errors import ConveyorError, ExecutionNotFoundError, UnknownActionError
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.domain.ids import is_id
from conveyor.domain.models import Attempt, Execution, ExecutionSummary, WorkerInfo, summary_fields
from conveyor.domain.status import ExecutionStatus
from conveyor.sdk.dead_letters import DeadLetterMethods
from conveyor.sdk.events import EventMethods
from conveyor.sdk.output import OutputMethods
from conveyor.sdk.rules import RuleMethods
from conveyor.sdk.schedules import ScheduleMethods
from conveyor.sdk.tokens import TokenMethods
from conveyor.sdk.webhooks import WebhookMethods
from conveyor.sdk.workflows import WorkflowMethods
from conveyor.store.db import connect_sync
from conveyor.store.queries import Q
from conveyor.verbs import common as verbs
from conveyor.verbs import executions
from conveyor.verbs import inquiries as iv
from conveyor.verbs import policies as pv
from conveyor.verbs import workers as wv
from conveyor.verbs.drive import run

# Kept importable from here (the SDK's public names before conveyor.verbs existed).
validate_parameters = verbs.validate_parameters
valid_policy_target = pv.valid_target


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


def request_execution(
    conn: psycopg.Connection[Any],
    action_ref: str,
    parameters: dict[str, Any] | None = None,
    *,
    schema: str = "conveyor",
    idempotency_key: str | None = None,
    requested_by: str | None = None,
    not_before: datetime | None = None,
    delay: timedelta | None = None,
) -> int:
    """Create an execution in ``requested`` within ``conn``'s current transaction. With
    ``idempotency_key``, a retry with the same key returns the first execution (for at
    least executor.idempotency_key_retention); the key reused for another request raises
    ConflictError. ``requested_by``: who asks (execution.requested_by; an inquiry with
    ``forbid_requester`` refuses this name's answer); it is set for the rest of the
    transaction (``SET LOCAL conveyor.requested_by``). ``not_before`` (timezone-aware) or
    ``delay`` (from the database's now(), not this machine's clock): it stays ``requested``
    until then; a time already past means now. Not part of the idempotency check."""
    params = parameters or {}
    check_idempotency_key(idempotency_key)
    if not_before is not None and delay is not None:
        raise DelayError("give not_before or delay, not both")
    if not_before is not None:
        check_aware(not_before)
    if delay is not None:
        check_delay(delay)
    validate_parameters(action_ref, _schema_of(conn, action_ref, schema), params)
    # A savepoint: a refusal by the database (CVA01/CVA02/CVA03) is raised as a ConveyorError
    # and must leave the caller's transaction usable, as a client-side refusal does.
    with verbs.refusals(action_ref=action_ref), conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        if requested_by is not None:
            cur.execute(Q["set_requested_by"], {"by": requested_by})
        cur.execute(
            sql.SQL(
                "SELECT {}.request_execution(%s, %s, idempotency_key => %s,"
                " not_before => coalesce(%s::timestamptz, now() + %s::interval))"
            ).format(sql.Identifier(schema)),
            (action_ref, Jsonb(params), idempotency_key, not_before, delay),
        )
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def request_executions(
    conn: psycopg.Connection[Any],
    requests: Sequence[tuple[str, dict[str, Any]]],
    *,
    schema: str = "conveyor",
    not_before: datetime | None = None,
    delay: timedelta | None = None,
) -> list[int]:
    """Batch form of :func:`request_execution`: all rows or none, in few statements (one
    up to _BATCH_BYTES of JSON). ``not_before`` or ``delay`` (from the database's now())
    holds every one of them until then. Returns the ids in request order."""
    if not_before is not None and delay is not None:
        raise DelayError("give not_before or delay, not both")
    if not_before is not None:
        check_aware(not_before)
    if delay is not None:
        check_delay(delay)
    checks: dict[str, Callable[[Any], None]] = {}
    for ref, params in requests:
        check = checks.get(ref)
        if check is None:
            check = checks[ref] = verbs.parameters_checker(ref, _schema_of(conn, ref, schema))
        check(params)
    # The parameters travel as ONE JSON array per statement (one json.dumps, one document
    # for the server to parse): measured 6-8x cheaper than a jsonb[] of as many elements,
    # and cheaper than COPY into a staging table (see docs/performance.md).
    query = sql.SQL(
        "SELECT id FROM (SELECT %b::text[] AS refs, coalesce(%s::timestamptz, now() + %s::interval) AS t) a,"
        " LATERAL {}.request_execution_batch(a.refs, %b::text::jsonb,"
        " CASE WHEN a.t IS NOT NULL THEN array_fill(a.t, ARRAY[cardinality(a.refs)]) END) AS id"
    ).format(sql.Identifier(schema))
    ids: list[int] = []
    # A savepoint inside the caller's transaction (or a transaction of its own under
    # autocommit): the chunks are stored all or none. Refusals by the database (CVA01,
    # CVA02: an unknown action, parameters outside the SQL subset) name their row, by its
    # position in the statement's refs.
    with verbs.refusals(), conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        for refs, document in _chunks(requests):
            with verbs.refusals(refs=refs):
                cur.execute(query, (refs, not_before, delay, document))
            ids.extend(int(r[0]) for r in cur.fetchall())
    return ids


# A statement's JSON stays far below jsonb's 255 MB limit and bounds the memory of both ends.
_BATCH_BYTES = 32 * 1024 * 1024
_BLOCK_ROWS = 10_000


def _chunks(requests: Sequence[tuple[str, dict[str, Any]]]) -> Iterator[tuple[list[str], str]]:
    """(refs, one JSON array of their parameters) per statement: blocks of _BLOCK_ROWS
    encoded at once, joined while under _BATCH_BYTES."""
    refs: list[str] = []
    parts: list[str] = []
    size = 0
    for start in range(0, len(requests), _BLOCK_ROWS):
        block = requests[start : start + _BLOCK_ROWS]
        encoded = json.dumps([params for _, params in block])[1:-1]
        if parts and size + len(encoded) > _BATCH_BYTES:
            yield refs, "[" + ",".join(parts) + "]"
            refs, parts, size = [], [], 0
        refs.extend(ref for ref, _ in block)
        parts.append(encoded)
        size += len(encoded)
    if parts:
        yield refs, "[" + ",".join(parts) + "]"


def _execution(row: dict[str, Any], attempts: tuple[Attempt, ...] = ()) -> Execution:
    return Execution(**{**row, "status": ExecutionStatus(row["status"])}, attempts=attempts)


class Client(
    WorkflowMethods,
    RuleMethods,
    ScheduleMethods,
    WebhookMethods,
    EventMethods,
    OutputMethods,
    TokenMethods,
    DeadLetterMethods,
):
    """A synchronous client for scripts and the CLI (workflow methods: sdk_workflows.py).
    ``user``: who this client acts for, recorded as the requester of its executions and
    the responder of its answers to inquiries (None: requests name nobody; answers need
    ``responder=``). ``document_limits``: the bounds on the YAML and JSON documents it
    reads (the ``documents`` settings; the CLI passes its own). ``verb_retries``: how many
    more times a cancel, pause or resume runs when the database rolled it back (``database.verb_retries``)."""

    def __init__(
        self,
        url: str,
        schema: str = "conveyor",
        *,
        user: str | None = None,
        document_limits: Limits = DEFAULT_LIMITS,
        verb_retries: int = VERB_RETRIES,
    ) -> None:
        self.url = url
        self.schema = schema
        self.user = user
        self.document_limits = document_limits
        self.verb_retries = verb_retries
        self.conn = connect_sync(url, schema, application_name="conveyor-client", autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        action_ref: str,
        parameters: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        not_before: datetime | None = None,
        delay: timedelta | None = None,
    ) -> int:
        with self.conn.transaction():
            return request_execution(
                self.conn,
                action_ref,
                parameters,
                schema=self.schema,
                idempotency_key=idempotency_key,
                requested_by=self.user,
                not_before=not_before,
                delay=delay,
            )

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
                  "until": None, "before": before, "limit": limit, "with_result": True,
                  "parameters": None, "error": None, "floor": None}  # fmt: skip
        rows = self.conn.execute(Q["api_list_executions"], params).fetchall()
        return [ExecutionSummary(**{**summary_fields(r), "status": ExecutionStatus(r["status"])}) for r in rows]

    def workers(self) -> list[WorkerInfo]:
        return [WorkerInfo(**r) for r in self.conn.execute(Q["list_workers"]).fetchall()]

    def cordon(self, name: str, cordoned: bool = True) -> int:
        return int(run(self.conn, wv.cordon(name, cordoned))["id"])

    def drain(self, name: str) -> int:
        """Cordon the worker and hand its not-yet-started work to others; what it runs
        finishes there. Returns how many executions were handed back."""
        return int(run(self.conn, wv.drain(name))["handed_back"])

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
        return run(self.conn, pv.get(target))

    def set_policy(
        self, target: str, concurrency: int, parameters: Sequence[str] = (), method: str = "enqueue"
    ) -> dict[str, Any]:
        """Create or replace the operator policy for ``target`` (an action ref, a pack or
        '*'); it wins over the action's own ``policy=``. Returns it as stored. Waiters a
        higher limit now allows are admitted by the database in the same transaction."""
        return run(self.conn, pv.set_policy(target, concurrency, parameters, method))

    def delete_policy(self, target: str) -> dict[str, Any]:
        """Delete the policy for ``target``; its waiters become schedulable. Deleting an
        operator's override of an action's own policy puts that one back (returned as
        ``restored``); deleting a policy that an action's definition declares is refused."""
        return run(self.conn, pv.delete_policy(target))

    def admission(self, execution_id: int) -> dict[str, Any] | None:
        """Where the execution stands in admission: ``state`` holding|waiting, ``policy``,
        ``group_key``, ``ahead`` (requests of its group before it), ``since``; None when no
        policy holds it (none applies, or it has ended)."""
        row = self.conn.execute(Q["admission_of"], {"id": execution_id}).fetchone()
        return dict(row) if row else None

    def cancel(self, execution_id: int, *, by: str = "sdk", policy: str | None = None) -> str:
        """Cancel an execution; returns its new status: ``cancelled`` (it had not started),
        or ``canceling`` while its worker stops it (then ``cancelled``). A finished one
        raises ConflictError. A running workflow is ``canceling`` until its children
        settle: ``policy`` ``allow_finish`` (the default) lets them finish,
        ``cancel_running`` cancels them. A deadlock with the executor is retried
        (``verb_retries``)."""

        return run(self.conn, lambda: executions.cancel(execution_id, by, policy), retries=self.verb_retries)

    # -- inquiries (see docs/inquiries.md) -------------------------------------------------

    def inquiries(
        self, *, status: str | None = None, limit: int = 50, before: int | None = None
    ) -> list[dict[str, Any]]:
        """Newest first; ``status="pending"`` for the ones waiting for an answer."""
        params = {"status": status, "before": before, "limit": limit}
        return list(self.conn.execute(Q["list_inquiries"], params).fetchall())

    def inquiry(self, inquiry_id: int) -> dict[str, Any]:
        """One inquiry, with ``responses``: every answer given (responder, role, data, created)."""
        row = self.conn.execute(Q["get_inquiry"], {"id": inquiry_id}).fetchone() if is_id(inquiry_id) else None
        if row is None:
            raise iv.not_found(inquiry_id)
        return {**row, "responses": self.conn.execute(Q["inquiry_responses"], {"id": inquiry_id}).fetchall()}

    def respond(
        self, inquiry_id: int, data: Any, *, responder: str | None = None, role: str = "admin"
    ) -> dict[str, Any]:
        """Answer an inquiry as ``responder`` (default: this client's ``user``) with ``role``
        (a database connection may do anything: admin by default). The answer is checked
        against the inquiry's schema (InvalidAnswerError names each problem's path).
        Returns ``outcome`` answered (the quorum is reached: the asking execution completed)
        or recorded (more responders needed); refusals raise NotFoundError, ForbiddenError
        (not an assignee; the forbidden requester) or ConflictError (not pending any more;
        this responder answered already)."""
        who = responder or self.user
        if not who:
            raise ConveyorError("who answers? pass responder= (or create the Client with user=)")
        return run(self.conn, iv.respond(inquiry_id, data, responder=who, role=role))

    def wait(
        self,
        execution_id: int,
        timeout: float | None = None,
        *,
        on_poll: Callable[[Execution], None] | None = None,
        interval: float = 1.0,
    ) -> Execution:
        """Block until the execution is terminal (woken by NOTIFY, re-checked every
        ``interval`` seconds). ``on_poll`` sees each read of it (without attempts), the
        terminal one included: only the end is notified, so a caller that shows progress
        (``conveyor run --wait`` on a terminal) passes a shorter ``interval``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"{self.schema}.completed")))
        try:
            while True:
                execution = self.get(execution_id, with_attempts=False)
                if on_poll is not None:
                    on_poll(execution)
                if execution.status.is_terminal:
                    return self.get(execution_id)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ConveyorError(f"execution {execution_id} is still {execution.status} after {timeout:g}s")
                wait = interval if remaining is None else min(interval, remaining)
                for _ in self.conn.notifies(timeout=wait, stop_after=1):
                    pass
        finally:
            self.conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(f"{self.schema}.completed")))
