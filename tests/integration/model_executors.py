"""The model's executor-side events: requests and cancels through the SDK, scheduling
rounds of two replicas (also racing), a replica crashing after its claim, the stale-claim
reclaim, the dead-worker sweep, the schedule-to-start monitor, dead letters, policy changes
and the admission repair. ``test_model.Model`` draws them; they read and write the
model's ``World`` (model_world.py), which the worker-side events share."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from hypothesis import event
from hypothesis import strategies as st

from conveyor.domain.errors import ConflictError
from conveyor.executor.scheduler import NO_WORKERS, Scheduler
from conveyor.sdk import request_executions
from conveyor.store.queries import Q
from integration.model_world import (
    LOST_MAX,
    MAX_EXECUTIONS,
    ON_WORKER,
    RESCHEDULES,
    TERMINAL,
    Dispatch,
    Policy,
    Requested,
    Snap,
    World,
    canonical,
    claim_then_crash,
)


class ExecutorEvents:
    def __init__(self, world: World) -> None:
        self.world = world
        self.crashes = itertools.count(1)  # the crashed replicas' ids

    # -- requests and cancels -------------------------------------------------------------

    def request_spec(self) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
        return st.one_of(
            st.sampled_from(self.world.echo_values).map(lambda m: ("core.echo", {"message": m})),
            st.sampled_from([0, 1]).map(lambda s: ("core.sleep", {"seconds": s})),
            st.just(("core.noop", {})),
            st.sampled_from(["true", "false"]).map(lambda c: ("core.local", {"cmd": c})),
        )

    def on_request(self, data: st.DataObject) -> None:
        if len(self.world.requested) < MAX_EXECUTIONS:
            specs = data.draw(st.lists(self.request_spec(), min_size=1, max_size=3), label="requests")
            # A batch is one INSERT: the admission trigger sees all of them in one statement.
            self.submit(specs, batch=data.draw(st.booleans(), label="one statement"))

    def submit(self, specs: list[tuple[str, dict[str, Any]]], batch: bool) -> None:
        """Request through the SDK; each governed request is admitted, queued or (cancel
        policy, group full) refused at once."""
        if not specs:
            return
        status = {
            r["id"]: r["status"] for r in self.world.env.conn.execute("SELECT id, status FROM execution").fetchall()
        }
        if batch:
            with self.world.env.client.conn.transaction():
                ids = request_executions(self.world.env.client.conn, specs)
        else:
            ids = [self.world.env.client.request(ref, params) for ref, params in specs]
        assert ids == sorted(ids)
        rows = {r["id"]: r for r in self.world.env.conn.execute("SELECT * FROM execution WHERE id = ANY(%s)", (ids,))}
        held: Counter[tuple[str, str]] = Counter(
            (r.policy, r.group)
            for eid, r in self.world.requested.items()
            if r.policy and r.group and status[eid] not in TERMINAL
        )
        for eid, (ref, params) in zip(ids, specs, strict=True):
            target, group, row = self.world.policy_for(ref), None, rows[eid]
            if target is not None:
                policy = self.world.policies[target]
                group = canonical({p: params.get(p) for p in policy.parameters})
                if policy.method == "cancel" and held[(target, group)] >= policy.concurrency:
                    event("request refused by a cancel policy")
                    assert row["status"] == "cancelled", row
                    assert row["result"]["cancelled_by"] == "admission", row
                    assert row["result"]["policy"] == target, row
                    self.world.requested[eid] = Requested(ref, params, target, group)
                    continue
                held[(target, group)] += 1
            assert row["status"] == "requested", row
            self.world.requested[eid] = Requested(ref, params, target, group)

    def on_cancel(self, data: st.DataObject) -> None:
        """The SDK's cancel (the API runs the same query). Drawn again for the same
        execution, it is a duplicate request."""
        if not self.world.requested:
            return
        eid = data.draw(st.sampled_from(sorted(self.world.requested)), label="execution")
        before = self.world.execution(eid)
        try:
            now: str | None = self.world.env.client.cancel(eid, by="model")
        except ConflictError:
            now = None
        self.world.check_cancel(before, now)

    # -- executors ------------------------------------------------------------------------

    def new_dispatches(self, before: Snap, after: Snap) -> list[Dispatch]:
        """Executions dispatched by the step; each must be on a worker that could take it."""
        found = []
        open_ = {p.worker_id: p for p in self.world.acting("alive") if p.name not in self.world.cordoned}
        for eid, e in after.executions.items():
            was = before.executions.get(eid)
            if e["status"] != "scheduled" or (was and was["status"] == "scheduled" and was["attempt"] == e["attempt"]):
                continue
            assert was is not None, f"{eid} dispatched from nowhere"
            assert was["status"] == "requested", f"{eid} dispatched from {was}"
            assert eid not in before.queue, f"waiter {eid} was dispatched"
            proc = open_.get(e["worker"])
            assert proc is not None, f"{eid} dispatched to worker {e['worker']}: dead, cordoned or unknown"
            ref = e["action_ref"]
            assert ref in proc.actions or (ref == "core.local" and "shell" in proc.runtimes), (ref, proc)
            found.append(Dispatch(eid, e["attempt"], e["worker"], e["scheduled"]))
        load = Counter(e["worker"] for e in after.executions.values() if e["status"] in ON_WORKER and e["worker"])
        for wid in {d.worker for d in found}:
            assert load[wid] <= after.workers[wid]["capacity"], ("dispatched beyond capacity", after.workers[wid])
        self.world.dispatches += found
        return found

    def round(self, executor: str) -> None:
        before = self.world.snapshot()
        result = self.world.env.run(self.world.schedulers[executor].run_round())
        after = self.world.snapshot()
        new = self.new_dispatches(before, after)
        assert result.dispatched == len(new), (result, new)
        if new:
            event("round: dispatched")
        for eid, e in after.executions.items():
            was = before.executions[eid]
            if was["status"] != "failed" and e["status"] == "failed":
                event("round: failed, no worker")
                assert e["result"]["failed_by"] == "scheduler", e
                assert e["result"]["error"] == NO_WORKERS.format(ref=e["action_ref"])
                assert was["status"] == "requested", was
                assert eid not in before.queue

    def on_round_A(self, data: st.DataObject) -> None:
        self.round("A")

    def on_round_B(self, data: st.DataObject) -> None:
        self.round("B")

    async def race(self) -> tuple[Any, Any, Any]:
        a, b, swept = await asyncio.gather(
            self.world.schedulers["A"].run_round(), self.world.schedulers["B"].run_round(), self.world.recovery.sweep()
        )
        return a, b, swept

    def on_replicas_race(self, data: st.DataObject) -> None:
        """Both replicas' rounds and a sweep at the same time, each on its own connection."""
        before = self.world.snapshot()
        a, b, _ = self.world.env.run(self.race())
        after = self.world.snapshot()
        new = self.new_dispatches(before, after)
        assert a.dispatched + b.dispatched == len(new), (a, b, new)
        self.check_swept(after)

    def on_crash_after_claim(self, data: st.DataObject) -> None:
        """A replica claims, then dies before placing anything (its restart has a new id)."""
        scheduler = Scheduler(
            self.world.env.pool, executor_id=f"ex-C{next(self.crashes)}", batch_size=4,
            no_worker_grace=self.world.grace, unplaceable_check_interval=0,
        )  # fmt: skip
        before = self.world.snapshot()
        ids = self.world.env.run(claim_then_crash(scheduler, self.world.env.pool))
        for eid in ids:
            assert before.executions[eid]["status"] == "requested"
            assert eid not in before.queue
            assert self.world.execution(eid)["status"] == "scheduling"
        self.world.stuck |= set(ids)

    def on_reclaim(self, data: st.DataObject) -> None:
        before = self.world.snapshot()
        stuck = {eid for eid, e in before.executions.items() if e["status"] == "scheduling"}
        assert stuck <= self.world.stuck
        assert self.world.env.run(self.world.schedulers["B"].reclaim_stale(1e-6)) == len(stuck)
        for eid in stuck:
            now = self.world.execution(eid)
            assert (now["status"], now["executor"]) == ("requested", None), now
            assert now["attempt"] == before.executions[eid]["attempt"], now
        self.world.stuck.clear()

    # -- recovery -------------------------------------------------------------------------

    def check_swept(self, after: Snap) -> None:
        """After a sweep nothing is on a worker the model knows is dead."""
        for wid in self.world.model_dead():
            assert after.workers[wid]["status"] == "inactive", after.workers[wid]
        for e in after.executions.values():
            if e["status"] in ON_WORKER:
                assert e["worker"] is not None, e
                assert after.workers[e["worker"]]["status"] != "inactive", e
                assert e["worker"] not in self.world.model_dead(), e

    def on_sweep(self, data: st.DataObject) -> None:
        before = self.world.snapshot()
        dead = {wid for wid in self.world.model_dead() if before.workers[wid]["status"] != "inactive"}
        counts = self.world.env.run(self.world.recovery.sweep())
        after = self.world.snapshot()
        assert counts["dead"] == len(dead), (counts, dead)
        gone = {wid for wid, w in after.workers.items() if w["status"] == "inactive"}
        for eid, was in before.executions.items():
            now = after.executions[eid]
            status, worker = was["status"], was["worker"]
            if status == "scheduled" and worker in gone:
                event("sweep: handed back")  # never started: its attempt withdrawn
                assert (now["status"], now["attempt"], now["worker"]) == ("requested", was["attempt"] - 1, None)
                assert self.world.attempt_row(eid, was["attempt"]) is None
            elif status in ("running", "canceling") and (worker is None or worker in gone):
                lost = sum(1 for a in before.attempts[eid] if a["outcome"] == "worker_lost") + 1
                expected = "cancelled" if status == "canceling" else "abandoned" if lost >= LOST_MAX else "requested"
                event(f"sweep: {status} -> {expected}")
                assert (now["status"], now["attempt"]) == (expected, was["attempt"]), (was, now)
                closed = self.world.attempt_row(eid, was["attempt"])
                assert closed is not None
                assert closed["outcome"] == "worker_lost"
            else:
                assert now["status"] == status, (was, now)
        self.check_swept(after)

    def on_scheduled_timeouts(self, data: st.DataObject) -> None:
        """Every dispatch is overdue (timeout 1 µs): moved on once, failed the second time."""
        before = self.world.snapshot()
        self.world.env.run(self.world.recovery.check_scheduled_timeouts())
        after = self.world.snapshot()
        for eid, was in before.executions.items():
            now = after.executions[eid]
            if was["status"] != "scheduled":
                assert now["status"] == was["status"], (was, now)
                continue
            missed = sum(1 for a in before.attempts[eid] if a["outcome"] in ("not_picked_up", "expired"))
            expected = "requested" if missed < RESCHEDULES else "failed"
            event(f"scheduled timeout -> {expected}")
            assert (now["status"], now["attempt"]) == (expected, was["attempt"]), (was, now)
            closed = self.world.attempt_row(eid, was["attempt"])
            assert closed is not None
            assert closed["outcome"] == "not_picked_up"

    def on_dead_letter(self, data: st.DataObject) -> None:
        """A dispatch expired in its worker's queue. Drawn again, it is a redelivery of the
        same dead letter; drawn after the execution moved on, a stale one."""
        if not self.world.dispatches:
            return
        dispatch = data.draw(st.sampled_from(self.world.dispatches), label="dispatch")
        handler = self.world.dead_letter_handler
        letter = handler._expired(
            {"id": dispatch.id, "attempt": dispatch.attempt, "worker": dispatch.worker, "scheduled": dispatch.scheduled}
        )
        before = self.world.snapshot()
        was = before.executions[dispatch.id]
        current = (was["status"], was["attempt"], was["worker"], was["scheduled"]) == (
            "scheduled",
            dispatch.attempt,
            dispatch.worker,
            dispatch.scheduled,
        )
        again = letter.dedupe_key in self.world.dead_letters
        if again:
            expected = self.world.dead_letters[letter.dedupe_key]
        elif current:
            missed = sum(1 for a in before.attempts[dispatch.id] if a["outcome"] in ("not_picked_up", "expired"))
            expected = "rescheduled" if missed < RESCHEDULES else "failed"
        else:
            expected = "stale"
        resolution = self.world.env.run(handler.handle(letter))
        assert resolution == expected, (dispatch, was, resolution)
        event(f"dead letter: {resolution}{' (redelivered)' if again else ''}")
        after = self.world.snapshot()
        if again or expected == "stale":
            assert after.executions == before.executions
            assert after.attempts == before.attempts
        else:
            now = after.executions[dispatch.id]
            assert now["status"] == ("requested" if expected == "rescheduled" else "failed"), now
            closed = self.world.attempt_row(dispatch.id, dispatch.attempt)
            assert closed is not None
            assert closed["outcome"] == "expired"
        self.world.dead_letters.setdefault(letter.dedupe_key, resolution)

    def on_raise_limit(self, data: st.DataObject) -> None:
        """An operator raises a policy's limit: its waiters are admitted up to it at once."""
        target = data.draw(st.sampled_from(sorted(self.world.policies)), label="policy")
        p = self.world.policies[target]
        if p.concurrency < 3:
            raised = Policy(p.concurrency + 1, p.parameters, p.method)
            self.world.env.conn.execute(
                Q["set_policy"],
                {"target": target, "concurrency": raised.concurrency, "parameters": list(p.parameters),
                 "method": p.method},
            )  # fmt: skip
            self.world.policies[target] = raised

    def on_admission_repair(self, data: st.DataObject) -> None:
        """The executors' upkeep finds nothing to mend: the triggers never leave a free
        slot with someone waiting for it."""
        assert self.world.env.run(self.world.schedulers["A"].repair_admission()) == 0
