"""The model-based test of workflow advancement: a hypothesis state machine requests small
workflows (a sequence, a ``with`` over items, a fan-out and join), ends their children at
random (completed, failed, cancelled), replays completions, cancels workflows, and runs
the advancing duty from two replicas -- one at a time and both at once -- against the real
database, through the product's code (request_execution, the scheduling round that starts
workflows, ``Advancer.run_pass``, ``cancel_execution``). After every step it checks the
invariants the chaos suite checks at the end (tests/chaos/workflows.py): one child per
(task, item, retry) chain, each join fired once, no child created after its workflow
ended, a workflow's execution and state agreeing once ended, an end never changing. At
teardown every child left completes and the replicas advance until nothing is left: every
workflow ends, and one whose children all completed has the output of a run without faults.

A companion of test_model.py (executions, workers, admission), kept apart: its model
predicts every execution's fate, and workflow children are made by the workflows.
Run it longer with CONVEYOR_MODEL_EXAMPLES=500.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb

from conveyor.domain.status import TERMINAL
from conveyor.executor.workflows import Advancer
from conveyor.sdk import request_execution
from conveyor.store.db import connect_sync, make_pool
from conveyor.transport.postgres import PostgresTransport
from conveyor.workflows.parse import parse_workflow
from integration.builders import Conn, Pool, scheduler
from integration.workflows.kit import end

SCHEMA = "conveyor"
ENDS = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}

SOURCES = {
    "model.sequence": """
ref: model.sequence
input: [tag]
tasks:
  s0:
    action: core.echo message="<% ctx(tag) %>-s0"
    next: [{when: "<% succeeded() %>", publish: [{seen: "<% [result()] %>"}], do: s1}]
  s1:
    action: core.echo message="<% ctx(tag) %>-s1"
    next: [{when: "<% succeeded() %>", publish: [{seen: "<% ctx(seen) + [result()] %>"}]}]
output: [{seen: "<% ctx(seen) %>"}]
""",
    "model.items": """
ref: model.items
input: [tag]
tasks:
  each:
    with: {items: "i in <% [0, 1, 2] %>", concurrency: 2}
    action: core.echo message="<% ctx(tag) %>-item-<% item(i) %>"
    next: [{when: "<% succeeded() %>", publish: [{all: "<% result() %>"}]}]
output: [{all: "<% ctx(all) %>"}]
""",
    "model.join": """
ref: model.join
input: [tag]
tasks:
  fan:
    action: core.echo message="<% ctx(tag) %>-fan"
    next: [{do: [a, b]}]
  a:
    action: core.echo message="<% ctx(tag) %>-a"
    next: [{do: [joined]}]
  b:
    action: core.echo message="<% ctx(tag) %>-b"
    next: [{do: [joined]}]
  joined:
    join: all
    action: core.echo message="<% ctx(tag) %>-joined"
    next: [{publish: [{last: "<% result() %>"}]}]
output: [{last: "<% ctx(last) %>"}]
""",
}


def expected(ref: str, tag: str) -> Any:
    if ref == "model.sequence":
        return {"seen": [f"{tag}-s0", f"{tag}-s1"]}
    if ref == "model.items":
        return {"all": [f"{tag}-item-{i}" for i in range(3)]}
    return {"last": f"{tag}-joined"}


class WorkflowModel(RuleBasedStateMachine):
    def __init__(self, conn: Conn, pool: Pool, transport: PostgresTransport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.conn, self.pool, self.transport, self.loop = conn, pool, transport, loop
        conn.execute("TRUNCATE execution, workflow_definition RESTART IDENTITY CASCADE")
        conn.execute("DELETE FROM action WHERE runner_type = 'workflow'")
        for text in SOURCES.values():
            spec = parse_workflow(text)
            conn.execute("SELECT register_workflow(%s, %s, %s, %s, %s)",
                         (spec.ref, Jsonb(spec.to_json()), text, "", Jsonb(spec.parameters_schema)))  # fmt: skip
        # No worker: children stay requested until a rule ends them (the grace keeps the
        # scheduling round from failing them for want of a worker).
        self.starter = scheduler(pool, transport, "ex-model", no_worker_grace=3600)
        self.replicas = {"A": Advancer(pool, batch_size=3), "B": Advancer(pool, batch_size=3)}
        self.made: dict[int, tuple[str, str]] = {}
        self.ended: dict[int, tuple[Any, ...]] = {}  # workflow execution -> its end, never to change
        self.replayed = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def live_children(self) -> list[dict[str, Any]]:
        return self.conn.execute(
            "SELECT c.id FROM execution c WHERE c.parent IS NOT NULL AND c.status <> ALL(%s) ORDER BY c.id",
            (list(TERMINAL),),
        ).fetchall()

    # -- rules ------------------------------------------------------------------------------

    @initialize(ref=st.sampled_from(sorted(SOURCES)))
    def first(self, ref: str) -> None:
        self.request(ref)

    @rule(ref=st.sampled_from(sorted(SOURCES)))
    def request(self, ref: str) -> None:
        tag = f"w{len(self.made)}"
        eid = request_execution(self.conn, ref, {"tag": tag})
        self.made[eid] = (ref, tag)
        self.run(self.starter.run_round())  # starts it: running, with its 'start' event

    @rule(data=st.data(), status=st.sampled_from(["completed", "completed", "completed", "failed", "cancelled"]))
    def end_child(self, data: st.DataObject, status: str) -> None:
        live = self.live_children()
        if not live:
            return
        child = data.draw(st.sampled_from([r["id"] for r in live]), label="child")
        params = self.conn.execute("SELECT parameters FROM execution WHERE id = %s", (child,)).fetchone()
        assert params is not None
        end(self.conn, child, status, params["parameters"]["message"] if status == "completed" else None)

    @rule(data=st.data())
    def replay_completion(self, data: st.DataObject) -> None:
        """A child's end told again after its first event was applied (while that one is
        pending the unique index keeps one: nothing to replay)."""
        ended = self.conn.execute(
            "SELECT c.id FROM execution c WHERE c.parent IS NOT NULL AND c.status = ANY(%s)"
            " AND NOT EXISTS (SELECT 1 FROM workflow_event ev WHERE ev.execution = c.id)",
            (list(TERMINAL),),
        ).fetchall()
        if not ended:
            return
        child = data.draw(st.sampled_from([r["id"] for r in ended]), label="replayed child")
        self.replayed += self.conn.execute(
            "INSERT INTO workflow_event (workflow_execution, kind, execution) SELECT w.id, 'child_ended', c.id"
            " FROM execution c JOIN workflow_execution w ON w.execution = c.parent WHERE c.id = %s"
            " ON CONFLICT DO NOTHING",
            (child,),
        ).rowcount

    @rule(replica=st.sampled_from("AB"))
    def advance(self, replica: str) -> None:
        self.run(self.replicas[replica].run_pass())

    @rule()
    def advance_both_at_once(self) -> None:
        async def both() -> None:
            await asyncio.gather(self.replicas["A"].run_pass(), self.replicas["B"].run_pass())

        self.run(both())

    @rule(data=st.data())
    def cancel_workflow(self, data: st.DataObject) -> None:
        if self.made:
            eid = data.draw(st.sampled_from(sorted(self.made)), label="cancelled workflow")
            self.conn.execute("SELECT * FROM cancel_execution(%s, 'model')", (eid,)).fetchall()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        c = self.conn
        children = c.execute(
            "SELECT c.id, c.parent, c.parameters ->> 'message' AS message, c.created, p.ended AS parent_ended"
            " FROM execution c JOIN execution p ON p.id = c.parent"
        ).fetchall()
        assert {ch["parent"] for ch in children} <= set(self.made), "a child of no workflow of ours"
        chains: Counter[tuple[int, str]] = Counter()
        current = set()
        for d in c.execute(
            "SELECT w.execution AS parent, d.task_name, d.task_index, d.execution, d.retry"
            " FROM workflow_task_dispatch d JOIN workflow_execution w ON w.id = d.workflow_execution"
        ).fetchall():
            tag = self.made[d["parent"]][1]
            step = f"item-{d['task_index']}" if d["task_index"] is not None else d["task_name"]
            chains[(d["parent"], f"{tag}-{step}")] += d["retry"] + 1
            if d["execution"] is not None:
                current.add(d["execution"])
        made = Counter((ch["parent"], ch["message"]) for ch in children)
        for key, n in made.items():
            assert n <= chains[key], f"{n} children for chain {key}, which allows {chains[key]}"
        assert current <= {ch["id"] for ch in children}
        for ch in children:
            assert ch["parent_ended"] is None or ch["created"] <= ch["parent_ended"], f"child after its end: {ch}"
        again = c.execute("SELECT workflow_execution, task_name FROM workflow_task WHERE iteration > 0").fetchall()
        assert again == [], f"a task entered twice (a join fired twice): {again}"
        for w in c.execute(
            "SELECT e.id, e.status, e.result, e.ended, w.status AS wf_status FROM execution e"
            " JOIN workflow_execution w ON w.execution = e.id WHERE e.status = ANY(%s)",
            (list(TERMINAL),),
        ).fetchall():
            assert ENDS.get(w["wf_status"]) == w["status"], f"execution and workflow state disagree: {w}"
            end_ = (w["status"], w["ended"], repr(w["result"]))
            assert self.ended.setdefault(w["id"], end_) == end_, f"an ended workflow changed: {w}"

    # -- teardown: run everything to its end --------------------------------------------------

    def teardown(self) -> None:
        for _ in range(40):
            for r in self.live_children():
                params = self.conn.execute("SELECT parameters FROM execution WHERE id = %s", (r["id"],)).fetchone()
                assert params is not None
                end(self.conn, r["id"], "completed", params["parameters"]["message"])
            self.advance("A")
            self.advance("B")
            busy = self.conn.execute(
                "SELECT (SELECT count(*) FROM execution WHERE status <> ALL(%s))"
                " + (SELECT count(*) FROM workflow_event) AS n",
                (list(TERMINAL),),
            ).fetchone()
            if busy is not None and busy["n"] == 0:
                break
        stuck = self.conn.execute(
            "SELECT id, action_ref, status FROM execution WHERE status <> ALL(%s)", (list(TERMINAL),)
        ).fetchall()
        assert stuck == [], f"left after the drain: {stuck}"
        assert self.conn.execute("SELECT count(*) AS n FROM workflow_event").fetchone() == {"n": 0}
        self.consistent()
        # A workflow none of whose children failed or was cancelled, and not cancelled
        # itself, ran as if nothing happened: its output is the faultless one.
        for eid, (ref, tag) in self.made.items():
            row = self.conn.execute(
                "SELECT e.status, e.result, e.cancelled_by, (SELECT count(*) FROM execution c WHERE c.parent = e.id"
                " AND c.status <> 'completed') AS bad FROM execution e WHERE e.id = %s",
                (eid,),
            ).fetchone()
            assert row is not None
            if row["bad"] == 0 and row["cancelled_by"] is None:
                assert (row["status"], row["result"]) == ("completed", expected(ref, tag)), (eid, ref, row)
            event(f"{ref} {row['status']}")
        if self.replayed:
            event("completions replayed")


@pytest.fixture
def world(db_url: str) -> Iterator[tuple[Conn, Pool, PostgresTransport, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    pool = make_pool(db_url, SCHEMA, "model-workflows", 6)
    loop.run_until_complete(pool.open())
    try:
        with connect_sync(db_url, SCHEMA, autocommit=True) as conn:
            yield conn, pool, PostgresTransport(db_url, SCHEMA), loop
    finally:
        loop.run_until_complete(pool.close())
        loop.close()


@pytest.mark.timeout(900)
def test_workflow_advancement_under_random_events_keeps_every_invariant(
    world: tuple[Conn, Pool, PostgresTransport, asyncio.AbstractEventLoop],
) -> None:
    run_state_machine_as_test(
        lambda: WorkflowModel(*world),
        settings=settings(
            max_examples=int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "30")),
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
