"""The model's worker-side events: worker processes started, killed, hung, resumed,
stopped gracefully, drained and uncordoned; claims, results (also late, repeated, or
beside an uncommitted cancel) and cancels honoured. ``test_model.Model`` draws them; they
read and write the model's ``World`` (model_world.py), which the executor-side events share."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import event
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

import conveyor
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus as S
from conveyor.store.queries import Q
from conveyor.store.rows import Decisions
from conveyor.worker.liveness import Liveness, NameInUseError
from integration.builders import waiting_on_a_lock
from integration.model_world import (
    SCHEMA,
    WORKER_CFG,
    WORKER_NAMES,
    WORKER_SPECS,
    Proc,
    Result,
    Row,
    World,
    noop,
    noop_lost,
)
from support.polling import until


class WorkerEvents:
    def __init__(self, world: World) -> None:
        self.world = world
        self.writer_pid: int | None = None  # the backend of the result written beside a cancel

    # -- worker processes -----------------------------------------------------------------

    def start_worker(self, name: str, capacity: int, actions: set[str], shell: bool) -> None:
        """A process starts under ``name``: refused while a process holding the name's
        lock exists; else it takes the row (same id) and detaches what a dead predecessor
        left running, for the sweep."""
        old = self.world.procs.get(name)
        if old is not None and old.state == "alive":
            return  # that process is running: nothing to start
        runtimes = ("python", "shell") if shell else ("python",)
        registration = {
            "name": name, "runtimes": list(runtimes), "actions": sorted(actions),
            "capabilities": Jsonb({"max_concurrent_tasks": capacity}), "capacity": capacity,
            "host": "model", "pid": 0, "version": conveyor.__version__,
        }  # fmt: skip
        liveness = Liveness(self.world.env.url, SCHEMA, WORKER_CFG, registration, on_lost=noop_lost, on_rejoined=noop)
        before = self.world.snapshot()
        try:
            worker_id = self.world.env.run(liveness.start())
        except NameInUseError:
            event("worker start refused: name in use")
            assert old is not None, name
            assert old.state == "hung", old
            self.world.env.run(liveness._drop_connection())
            return
        assert old is None or (old.state, old.worker_id) == ("killed", worker_id), (old, worker_id)
        proc = Proc(name, liveness, worker_id, capacity, frozenset(actions), runtimes)
        self.world.procs[name] = proc
        self.world.every_proc.append(proc)
        after = self.world.snapshot()
        for eid, was in before.executions.items():
            now = after.executions[eid]
            if was["worker"] == worker_id and was["status"] in ("running", "canceling"):
                event("worker restart detached a run")
                assert (now["status"], now["worker"]) == (was["status"], None), now
            else:
                assert (now["status"], now["worker"]) == (was["status"], was["worker"]), now

    def on_start_worker(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(WORKER_NAMES), label="name")
        self.start_worker(name, *data.draw(WORKER_SPECS, label="spec"))

    def on_kill_worker(self, data: st.DataObject) -> None:
        """The process dies: the server drops its session, and the liveness lock with it."""
        if not self.world.acting():
            return
        proc = data.draw(st.sampled_from(self.world.acting()), label="proc")
        self.world.env.run(proc.liveness._drop_connection())
        self.gone(proc)

    def gone(self, proc: Proc) -> None:
        """The process is gone once the server has dropped its session (the backend
        exits, and unlocks, asynchronously)."""
        for _ in range(500):
            held = self.world.env.conn.execute("SELECT worker_lock_held(%s) AS held", (proc.worker_id,)).fetchone()
            if held is not None and not held["held"]:
                break
            self.world.env.run(asyncio.sleep(0.01))
        else:
            pytest.fail(f"lock of worker {proc.worker_id} still held after its connection closed")
        proc.state, proc.runs = "killed", {}

    def on_stop_worker(self, data: st.DataObject) -> None:
        """A graceful shutdown past its timeout, as the worker service does it: draining,
        its not-yet-started work handed back (under the assignment lock), the runs it had
        to stop released (fenced on worker and attempt), then inactive and gone."""
        if not self.world.acting("alive"):
            return
        proc = data.draw(st.sampled_from(self.world.acting("alive")), label="proc")
        wid, c = proc.worker_id, self.world.env.conn
        before = self.world.snapshot()
        with c.transaction():
            c.execute(Q["lock_assignment"])
            c.execute(Q["set_worker_status"], {"id": wid, "status": "draining", "reason": None})
            back = c.execute(Q["hand_back_scheduled"], {"worker": wid}).fetchall()
        decisions = Decisions()
        for eid, attempt in proc.runs.items():
            decisions.add({"id": eid, "attempt": attempt}, Decision(S.REQUESTED, None, "worker shut down"))
        params = decisions.params(AttemptEnd.INTERRUPTED, by="worker", from_statuses=(S.RUNNING,), worker=wid)
        released = c.execute(Q["resolve_attempts"], params).fetchall() if decisions.ids else []
        runs = dict(proc.runs)
        self.world.env.run(proc.liveness.close())
        self.gone(proc)
        after = self.world.snapshot()
        scheduled = {eid for eid, e in before.executions.items() if e["status"] == "scheduled" and e["worker"] == wid}
        assert {r["id"] for r in back} == scheduled
        running = {
            eid
            for eid, attempt in runs.items()
            if (before.executions[eid]["status"], before.executions[eid]["worker"], before.executions[eid]["attempt"])
            == ("running", wid, attempt)
        }
        assert {r["id"] for r in released} == running
        for eid in scheduled | running:
            was, now = before.executions[eid], after.executions[eid]
            assert (now["status"], now["worker"]) == ("requested", None), now
            assert now["attempt"] == was["attempt"] - (eid in scheduled), (was, now)
        assert after.workers[wid]["status"] == "inactive"
        if released:
            event("stopped worker released its runs")

    def on_hang_worker(self, data: st.DataObject) -> None:
        """The process hangs or is cut off: no heartbeat, but its session and lock remain
        and it may still write later."""
        if not self.world.acting("alive"):
            return
        proc = data.draw(st.sampled_from(self.world.acting("alive")), label="proc")
        self.world.env.conn.execute(
            "UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (proc.worker_id,)
        )
        proc.state = "hung"

    def on_resume_worker(self, data: st.DataObject) -> None:
        """The hung process heartbeats again. If an executor declared it dead meanwhile,
        it rejoins (as its liveness loop does) and hands the runs it stopped to the sweep
        with ``detach_runs`` -- which must touch nothing: they were recovered (fenced)."""
        if not self.world.acting("hung"):
            return
        proc = data.draw(st.sampled_from(self.world.acting("hung")), label="proc")
        beat = self.world.env.conn.execute(Q["heartbeat"], {"id": proc.worker_id}).fetchone()
        event(f"hung worker resumes {'after' if beat is None else 'before'} being declared dead")
        if beat is None:
            self.world.env.run(proc.liveness._register())
            detached = self.world.env.conn.execute(
                Q["detach_runs"],
                {"ids": list(proc.runs), "attempts": list(proc.runs.values()), "worker": proc.worker_id},
            ).fetchall()
            assert detached == [], detached
            proc.runs = {}
        proc.state = "alive"

    def on_drain_worker(self, data: st.DataObject) -> None:
        """``workers drain``: cordoned, its not-yet-started work handed back."""
        if not self.world.procs:
            return
        name = data.draw(st.sampled_from(sorted(self.world.procs)), label="name")
        wid = self.world.procs[name].worker_id
        before = self.world.snapshot()
        on_it = [eid for eid, e in before.executions.items() if e["status"] == "scheduled" and e["worker"] == wid]
        assert self.world.env.client.drain(name) == len(on_it)
        for eid in on_it:
            now = self.world.execution(eid)
            assert (now["status"], now["attempt"]) == ("requested", before.executions[eid]["attempt"] - 1)
        self.world.cordoned.add(name)

    def on_uncordon_worker(self, data: st.DataObject) -> None:
        if self.world.cordoned:
            name = data.draw(st.sampled_from(sorted(self.world.cordoned)), label="name")
            self.world.env.client.cordon(name, False)
            self.world.cordoned.discard(name)

    def on_claim(self, data: st.DataObject) -> None:
        """The worker takes what was dispatched to it, up to its free slots. Repeated, it
        is a duplicate dispatch message: nothing is started twice."""
        if not self.world.acting():
            return
        proc = data.draw(st.sampled_from(self.world.acting()), label="proc")
        free = proc.capacity - len(proc.runs)
        if free <= 0:
            return
        before = self.world.snapshot()
        mine = [
            eid for eid, e in before.executions.items() if e["status"] == "scheduled" and e["worker"] == proc.worker_id
        ]
        rows = self.world.env.conn.execute(Q["claim_scheduled"], {"worker": proc.worker_id, "limit": free}).fetchall()
        assert sorted(r["id"] for r in rows) == mine[:free]  # oldest first
        for r in rows:
            event("claim: started a run")
            assert r["attempt"] == before.executions[r["id"]]["attempt"]
            assert proc.runs.get(r["id"]) != r["attempt"], f"{r['id']} attempt {r['attempt']} started twice"
            proc.runs[r["id"]] = r["attempt"]
            now = self.world.execution(r["id"])
            assert (now["status"], now["worker"]) == ("running", proc.worker_id)

    def deliver(self, result: Result) -> bool:
        """Send one result through ``finish``: it must be taken exactly when the row is
        still this worker's run of this attempt, and change nothing otherwise."""
        was = self.world.execution(result.execution)
        written = self.world.env.conn.execute(Q["finish"], result.params()).fetchall()
        return self.check_result(result, was, written)

    def check_result(self, result: Result, was: Row, written: list[Row]) -> bool:
        expected = (was["status"] in ("running", "canceling") and was["worker"] == result.proc.worker_id
                    and was["attempt"] == result.attempt)  # fmt: skip
        accepted = [r["id"] for r in written] == [result.execution]
        assert accepted == expected, (result, was, written)
        now = self.world.execution(result.execution)
        if not accepted:
            assert now == was, "a refused result changed the row"
            return False
        cancelled = was["status"] == "canceling"  # the cancel asked for wins over the run's outcome
        assert now["status"] == ("cancelled" if cancelled else result.status), now
        closed = self.world.attempt_row(result.execution, result.attempt)
        assert closed is not None
        assert closed["ended"] is not None
        assert closed["outcome"] == ("cancelled" if cancelled else result.outcome)
        if now["status"] == "requested":
            assert now["worker"] is None
            assert now["not_before"] is not None
        return True

    def finish(self, data: st.DataObject, late: bool) -> None:
        """A run ends (a retry asks for another attempt at once). ``late``: the result
        names the previous attempt, as a writer from before a re-dispatch would."""
        procs = [p for p in self.world.acting() if p.runs]
        if not procs:
            return
        proc = data.draw(st.sampled_from(procs), label="proc")
        eid = data.draw(st.sampled_from(sorted(proc.runs)), label="execution")
        outcome = data.draw(st.sampled_from(["completed", "failed", "timeout", "retry"]), label="outcome")
        attempt = proc.runs[eid] - 1 if late else proc.runs.pop(eid)
        status, delay = ("requested", 0.0) if outcome == "retry" else (outcome, None)
        result = Result(proc, eid, attempt, status, "failed" if outcome == "retry" else outcome, delay)
        taken = self.deliver(result)
        event(f"{'late ' if late else ''}result {'taken' if taken else 'refused'}")
        self.world.results.append(result)

    def on_finish(self, data: st.DataObject) -> None:
        self.finish(data, late=False)

    def on_finish_late(self, data: st.DataObject) -> None:
        self.finish(data, late=True)

    def on_cancel_during_result(self, data: st.DataObject) -> None:
        """Two writers at once: the API's cancel of one execution, not yet committed, while
        a worker's result for another is written on another connection (it may wait for
        the cancel's locks). The outcome must be that of the cancel, then the result."""
        procs = [p for p in self.world.acting() if p.runs]
        if not procs:
            return
        proc = data.draw(st.sampled_from(procs), label="proc")
        eid = data.draw(st.sampled_from(sorted(proc.runs)), label="execution")
        others = sorted(set(self.world.requested) - {eid})
        if not others:
            return
        # Half the time one of the first waiters for the slot this result may free.
        waiters = [
            r["execution"]
            for r in self.world.env.conn.execute(
                "SELECT q.execution FROM execution_admission_queue q JOIN execution_admission_slot s"
                " USING (policy, group_key) WHERE s.execution = %s ORDER BY q.seq LIMIT 2",
                (eid,),
            ).fetchall()
        ]
        candidates = (
            st.one_of(st.sampled_from(waiters), st.sampled_from(others)) if waiters else st.sampled_from(others)
        )
        victim = data.draw(candidates, label="cancelled")
        result = Result(proc, eid, proc.runs.pop(eid), "completed", "completed", None)
        before, was = self.world.execution(victim), self.world.execution(eid)
        other = self.world.env.other
        with other.transaction():
            row = other.execute(Q["cancel_execution"], {"id": victim, "by": "model"}).fetchone()
            self.writer_pid = None
            writing = self.world.env.loop.create_task(self.write_async(result))
            self.world.env.run(self.until_done_or_waiting(writing))
        written = self.world.env.run(writing)
        assert row is not None
        self.world.check_cancel(before, row["now"])
        self.check_result(result, was, written)
        self.world.results.append(result)

    async def write_async(self, result: Result) -> list[Row]:
        async with self.world.env.pool.connection() as conn:
            self.writer_pid = conn.info.backend_pid
            return await (await conn.execute(Q["finish"], result.params())).fetchall()

    async def until_done_or_waiting(self, task: asyncio.Task[Any]) -> None:
        """Until ``task`` has finished, or its statement waits for a lock (so it began
        before the other transaction commits, whatever the machine's speed)."""

        def done_or_waiting() -> bool:
            if task.done():
                return True
            if self.writer_pid is not None and waiting_on_a_lock(self.world.env.conn, self.writer_pid):
                event("result waited for the cancel's locks")
                return True
            return False

        await until(done_or_waiting, timeout=10, what="the result finished or waited for a lock", interval=0.005)

    def on_result_again(self, data: st.DataObject) -> None:
        """The same result message again: whatever became of the first, never taken now."""
        if self.world.results:
            assert not self.deliver(data.draw(st.sampled_from(self.world.results), label="result"))

    def on_honour_cancels(self, data: st.DataObject) -> None:
        """The worker's cancellation check: each of its executions being cancelled is
        stopped and finished as cancelled."""
        if not self.world.acting():
            return
        proc = data.draw(st.sampled_from(self.world.acting()), label="proc")
        for r in self.world.env.conn.execute(Q["canceling_on_worker"], {"worker": proc.worker_id}).fetchall():
            event("worker stopped a cancelled run")
            assert self.deliver(Result(proc, r["id"], r["attempt"], "cancelled", "cancelled", None))
            proc.runs.pop(r["id"], None)
