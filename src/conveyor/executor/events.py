"""The executor's rules duty: evaluate each pending event's rules, exactly once.

Woken by the ``event`` topic (an event emitted, replayed) and polled every
``events.poll_interval`` on every replica (the reconciler: a replica killed mid-pass leaves
its events pending, as its transaction never committed). A pass, in ONE transaction:

1. lock up to ``events.batch_size`` event_pending rows (FOR UPDATE SKIP LOCKED) and read
   their events with the rules on their triggers (``pick_pending_events``);
2. decide per (rule, event) with the pure :func:`conveyor.rules.render.decide` (criteria,
   templates);
3. write every decision with ``enforce_events`` (migration 0018): enforcements, their
   executions, the event_pending rows deleted;
4. commit; only then count metrics.

Exactly once: the enforcements, the executions and the deletion of the pending row commit
together or not at all, so a crash anywhere before the commit leaves the event pending with
nothing written, and after it leaves nothing to do. A second executor (or a duplicate
NOTIFY, or this pass replayed) finds the rows locked (skipped) or gone (enforce_events
ignores decisions for events it could not delete); uq_enforcement_rule_event and
uq_execution_enforcement are the backstops.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb

from conveyor.domain.documents import DEFAULT_LIMITS as DEFAULT_DOCUMENTS
from conveyor.domain.documents import Limits as DocumentLimits
from conveyor.ops import failpoints, metrics
from conveyor.rules.criteria import Criterion
from conveyor.rules.parse import criteria_of
from conveyor.rules.render import LIMITS, Decision, EventRow, RuleRow, decide
from conveyor.store.db import SESSION_ENDED, Pool, Row
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PassResult:
    events: int  # events taken (their rules evaluated)
    outcomes: dict[str, int]  # enforcements written, by outcome


class Enforcer:
    def __init__(self, pool: Pool, *, batch_size: int = 100, documents: DocumentLimits = DEFAULT_DOCUMENTS) -> None:
        # from_json_string() and the like in a rule's parameters read within documents.*.
        self._limits = replace(LIMITS, documents=documents)
        self._pool = pool
        self._batch_size = batch_size
        # Parsed criteria by (rule id, updated): a rule's criteria change only with updated.
        self._trees: dict[tuple[int, str], Criterion] = {}
        self._last_ids: list[int] = []  # the events the last transaction took up

    async def run_pass(self) -> PassResult:
        """Enforce a batch of pending events. A batch that the database refuses for another
        reason than an outage (an unforeseen error in one event's writes) is retried event
        by event, and an event refused alone is written with its requests recorded as
        'request_error' naming the error: one poison event must not hold up the queue."""
        try:
            return await self._pass(None, degrade=False)
        except SESSION_ENDED:
            raise  # the database is unreachable: the events stay for the next pass
        except psycopg.Error as batch_error:
            ids = self._last_ids
            if not ids:
                raise
            log.warning("a batch of rule enforcements failed; enforcing its events one by one", error=repr(batch_error))
        results = []
        for event_id in ids:
            try:
                results.append(await self._pass([event_id], degrade=False))
            except SESSION_ENDED:
                raise
            except psycopg.Error as exc:
                log.error(
                    "enforcing an event failed; recording its requests as request_error",
                    event_id=event_id,
                    error=repr(exc),
                )
                results.append(await self._pass([event_id], degrade=True, reason=str(exc)))
        outcomes: Counter[str] = Counter()
        for r in results:
            outcomes.update(r.outcomes)
        return PassResult(sum(r.events for r in results), dict(outcomes))

    async def _pass(self, ids: list[int] | None, *, degrade: bool, reason: str = "") -> PassResult:
        self._last_ids = []
        async with self._pool.connection() as conn, conn.transaction():
            query, params = (
                (Q["pick_pending_events"], {"limit": self._batch_size})
                if ids is None
                else (Q["lock_pending_events"], {"ids": ids})
            )
            rows = await (await conn.execute(query, params)).fetchall()
            if not rows:
                return PassResult(0, {})
            self._last_ids = [row["id"] for row in rows]
            failpoints.reach("events.after_claim")
            decisions = [d for row in rows for d in self._decide(row)]
            if degrade:
                decisions = [d.refused(reason) for d in decisions]
            written = await (
                await conn.execute(
                    Q["enforce_events"],
                    {"events": self._last_ids, "decisions": Jsonb([d.as_json() for d in decisions])},
                )
            ).fetchall()
            failpoints.reach("events.after_enforcement")
            failpoints.reach("events.before_commit")
        failpoints.reach("events.after_commit")
        outcomes = Counter(r["outcome"] for r in written if r["enforcement"] is not None)
        taken = [r["event"] for r in written if r["enforcement"] is None]
        matched = {r["event"] for r in written if r["enforcement"] is not None}
        for outcome, n in outcomes.items():
            metrics.ENFORCEMENTS.labels(outcome).inc(n)
        metrics.EVENTS_PROCESSED.labels("matched").inc(sum(1 for e in taken if e in matched))
        metrics.EVENTS_PROCESSED.labels("unmatched").inc(sum(1 for e in taken if e not in matched))
        for r in written:
            if r["outcome"] in ("template_error", "request_error"):
                log.warning(
                    "rule enforcement failed",
                    rule=r["rule_ref"],
                    event_id=r["event"],
                    outcome=r["outcome"],
                    error=r["error"],
                )
        return PassResult(len(taken), dict(outcomes))

    def _decide(self, row: Row) -> list[Decision]:
        event = EventRow(
            id=row["id"],
            trigger=row["trigger"],
            payload=row["payload"],
            source=row["source"],
            received=row["received"].isoformat(),
        )
        decisions = []
        for r in row["rules"]:
            rule = RuleRow(r["id"], r["ref"], r["criteria"], r["action_ref"], r["parameters"], r["enabled"])
            decision = decide(rule, event, self._tree(r), self._limits)
            if decision is not None:
                decisions.append(decision)
        return decisions

    def _tree(self, r: dict[str, Any]) -> Criterion | None:
        key = (int(r["id"]), str(r["updated"]))
        tree = self._trees.get(key)
        if tree is None:
            try:
                tree = criteria_of(r["criteria"])
            except Exception:
                return None
            if len(self._trees) > 10_000:  # bounded: rules updated over a long life
                self._trees.clear()
            self._trees[key] = tree
        return tree
