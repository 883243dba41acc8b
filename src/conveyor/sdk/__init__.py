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
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from conveyor.config.connections import VERB_RETRIES
from conveyor.domain.documents import DEFAULT_LIMITS, Limits
from conveyor.domain.errors import ConveyorError, ExecutionNotFoundError, UnknownActionError
from conveyor.domain.ids import is_id
from conveyor.domain.models import Attempt, Execution, ExecutionSummary, WorkerInfo, summary_fields
from conveyor.domain.retention import RetentionError
from conveyor.domain.status import ExecutionStatus
from conveyor.sdk.callers import in_callers_transaction
from conveyor.sdk.dead_letters import DeadLetterMethods
from conveyor.sdk.events import EventMethods
from conveyor.sdk.output import OutputMethods
from conveyor.sdk.rules import RuleMethods
from conveyor.sdk.schedules import ScheduleMethods
from conveyor.sdk.tokens import TokenMethods
from conveyor.sdk.webhooks import WebhookMethods
from conveyor.sdk.workflows import WorkflowMethods
from conveyor.store.db import channel, connect_sync
from conveyor.store.queries import Q
from conveyor.store.wakeups import Topic
from conveyor.verbs import executions
from conveyor.verbs import inquiries as iv
from conveyor.verbs import policies as pv
from conveyor.verbs import workers as wv
from conveyor.verbs.drive import run

# Kept importable from here (the SDK's public names before conveyor.verbs existed).
validate_parameters = executions.validate_parameters
valid_policy_target = pv.valid_target


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
    until then; a time already past means now. Not part of the idempotency check.
    ``schema``: Conveyor's, which ``conn``'s search_path need not name (it is the caller's
    again when this returns)."""
    verb = executions.request(
        action_ref,
        parameters,
        key=idempotency_key,
        by=requested_by,
        not_before=not_before,
        delay=delay,
    )
    return in_callers_transaction(conn, schema, verb)[0]


def request_executions(
    conn: psycopg.Connection[Any],
    requests: Sequence[tuple[str, dict[str, Any]]],
    *,
    schema: str = "conveyor",
    not_before: datetime | None = None,
    delay: timedelta | None = None,
) -> list[int]:
    """Batch form of :func:`request_execution`: all rows or none (a savepoint inside the
    caller's transaction, or a transaction of its own under autocommit), in few statements.
    ``not_before`` or ``delay`` (from the database's now()) holds every one of them until
    then. Returns the ids in request order."""
    return in_callers_transaction(conn, schema, executions.request_batch(requests, not_before=not_before, delay=delay))


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
        verb = executions.request(
            action_ref, parameters, key=idempotency_key, by=self.user, not_before=not_before, delay=delay
        )
        return run(self.conn, verb)[0]

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
        params = {
            "statuses": [status] if status else None,
            "action": action,
            "worker": None,
            "since": None,
            "until": None,
            "before": before,
            "limit": limit,
            "with_result": True,
            "parameters": None,
            "error": None,
            "floor": None,
        }
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

    # -- retention (docs/runbook.md#retention-of-finished-executions) ----------------------

    def purgeable(self, older_than: float, statuses: Sequence[str] | None = None) -> int:
        """How many finished top-level executions (of ``statuses``, else every finished
        status) ended more than ``older_than`` seconds ago (a large backlog takes a while to
        count: ~30 s for 7 M)."""
        params = {"older_than": older_than, "statuses": list(statuses) if statuses else None}
        try:
            row = self.conn.execute(Q["purgeable_executions"], params).fetchone()
        except psycopg.errors.InvalidParameterValue as exc:  # the function's own checks
            raise RetentionError(exc.diag.message_primary or str(exc)) from None
        return int(row["count"]) if row else 0

    def purge(self, older_than: float, statuses: Sequence[str] | None = None, *, batch: int = 1000) -> int:
        """Delete one batch (its own transaction) of at most ``batch`` such executions, with
        their trees (attempts, workflow children and state, idempotency keys, inquiries,
        dead letters, outbox rows, enforcements); trees a live workflow or an unresolved dead
        letter still refers to stay. Returns how many executions went (0: none left)."""
        return run(self.conn, executions.purge(older_than, list(statuses) if statuses else None, batch))

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
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(self.schema, Topic.COMPLETED))))
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
            self.conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel(self.schema, Topic.COMPLETED))))
