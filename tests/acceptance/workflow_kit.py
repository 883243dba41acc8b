"""Shared by the workflow crash tests (test_workflow_crashes.py, test_workflow_replicas.py):
three small workflows registered as the CLI registers them (the YAML parsed into a
WorkflowSpec, stored through ``register_workflow``), requested through the SDK, and the
invariants every crash scenario ends with, read from the database alone.

Each task and each item of the workflows below runs with parameters no other child of
the same workflow has, so a duplicate child is visible in ``execution`` itself
(children grouped by parent, action and parameters), not only through the engine's
own bookkeeping (``workflow_task_dispatch``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from acceptance.helpers import Proc, Procs, eventually
from conveyor.domain.status import TERMINAL
from conveyor.sdk import request_execution
from conveyor.workflows.parse import parse_workflow

Conn = psycopg.Connection[dict[str, Any]]
SIGKILLED = -9

# t0 -> t1 -> t2, each publishing what it echoed: the output proves the order.
SEQUENCE = """
ref: crash.sequence
input: [tag]
tasks:
  t0:
    action: core.echo message="<% ctx(tag) %>-t0"
    next:
      - when: <% succeeded() %>
        publish:
          - seen: <% [result()] %>
        do: t1
  t1:
    action: core.echo message="<% ctx(tag) %>-t1"
    next:
      - when: <% succeeded() %>
        publish:
          - seen: <% ctx(seen) + [result()] %>
        do: t2
  t2:
    action: core.echo message="<% ctx(tag) %>-t2"
    next:
      - when: <% succeeded() %>
        publish:
          - seen: <% ctx(seen) + [result()] %>
output:
  - seen: <% ctx(seen) %>
"""

# One task over five items, three at a time: results in item order.
ITEMS = """
ref: crash.items
input: [tag]
tasks:
  each:
    with:
      items: n in <% [0, 1, 2, 3, 4] %>
      concurrency: 3
    action: core.echo message="<% ctx(tag) %>-item-<% item(n) %>"
    next:
      - when: <% succeeded() %>
        publish:
          - all: <% result() %>
output:
  - all: <% ctx(all) %>
"""

# start -> (left, right) -> joined (join: all) -> end: the join must fire once.
JOIN = """
ref: crash.join
input: [tag]
tasks:
  start:
    action: core.echo message="<% ctx(tag) %>-start"
    next:
      - do: left, right
  left:
    action: core.echo message="<% ctx(tag) %>-left"
    next:
      - publish:
          - l: <% result() %>
        do: joined
  right:
    action: core.echo message="<% ctx(tag) %>-right"
    next:
      - publish:
          - r: <% result() %>
        do: joined
  joined:
    join: all
    action: core.echo message="<% ctx(tag) %>-joined"
    next:
      - publish:
          - j: <% result() %>
output:
  - both: <% [ctx(l), ctx(r), ctx(j)] %>
"""

# A task that takes a second (children in flight when something is killed), then one more.
SLOW = """
ref: crash.slow
input: [tag]
tasks:
  nap:
    action: core.sleep seconds=1
    next:
      - when: <% succeeded() %>
        publish:
          - slept: <% result() %>
        do: after
  after:
    action: core.echo message="<% ctx(tag) %>-after"
    next:
      - when: <% succeeded() %>
        publish:
          - last: <% result() %>
output:
  - slept: <% ctx(slept) %>
  - last: <% ctx(last) %>
"""

SOURCES = {"crash.sequence": SEQUENCE, "crash.items": ITEMS, "crash.join": JOIN, "crash.slow": SLOW}
FAST = ("crash.sequence", "crash.items", "crash.join")


def expected_output(ref: str, tag: str) -> dict[str, Any]:
    if ref == "crash.sequence":
        return {"seen": [f"{tag}-t0", f"{tag}-t1", f"{tag}-t2"]}
    if ref == "crash.items":
        return {"all": [f"{tag}-item-{i}" for i in range(5)]}
    if ref == "crash.slow":
        return {"slept": 1, "last": f"{tag}-after"}
    return {"both": [f"{tag}-left", f"{tag}-right", f"{tag}-joined"]}


# Children each workflow makes when nothing fails: one per task, one per item.
CHILDREN = {"crash.sequence": 3, "crash.items": 5, "crash.join": 4, "crash.slow": 2}


def register_all(db: Conn, sources: dict[str, str] | None = None) -> None:
    for ref, text in (sources or SOURCES).items():
        spec = parse_workflow(text)
        assert spec.ref == ref
        db.execute(
            "SELECT register_workflow(%s, %s, %s, %s, %s)",
            (spec.ref, Jsonb(spec.to_json()), text, spec.description, Jsonb(spec.parameters_schema)),
        )


def start_executor(procs: Procs, env: dict[str, str], label: str, **overrides: object) -> Proc:
    """An executor whose logs are its own (``label``): a replacement does not overwrite
    the log of the one that crashed."""
    proc = procs.start("executor", name=label, env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("executor started")
    return proc


def request_mix(db: Conn, n: int, refs: tuple[str, ...] = FAST) -> dict[int, tuple[str, str]]:
    """``n`` workflow executions, cycling through ``refs``: id -> (ref, tag)."""
    made = {}
    for i in range(n):
        ref = refs[i % len(refs)]
        tag = f"w{i}"
        made[request_execution(db, ref, {"tag": tag})] = (ref, tag)
    return made


def all_ended(procs: Procs, db: Conn, ids: list[int], timeout: float = 60) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        rows = db.execute("SELECT id, status, result FROM execution WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
        return rows if all(r["status"] in TERMINAL for r in rows) else None

    def stuck() -> str:
        rows = db.execute(
            "SELECT e.id, e.status, w.status AS wf, (SELECT count(*) FROM workflow_event ev"
            " WHERE ev.workflow_execution = w.id) AS events FROM execution e"
            " LEFT JOIN workflow_execution w ON w.execution = e.id"
            " WHERE e.id = ANY(%s) AND e.status <> ALL(%s) ORDER BY e.id LIMIT 20",
            (ids, list(TERMINAL)),
        ).fetchall()
        return f"workflows not ended: {rows}\n{procs.logs()}"

    rows: list[dict[str, Any]] = eventually(done, timeout=timeout, interval=0.1, message=stuck)
    return rows


def pending_events(db: Conn) -> int:
    return int(db.execute("SELECT count(*) AS n FROM workflow_event").fetchone()["n"])  # type: ignore[index]


def check_workflows(db: Conn, made: dict[int, tuple[str, str]], attempts: dict[int, int] | None = None) -> None:
    """The invariants every scenario ends with: each workflow completed with the output
    of a run without faults, nothing left to apply, one child per (task, item, retry)
    chain -- counted both in ``execution`` (children by parent and parameters) and
    against the dispatch rows -- each child ended before its workflow did, every join
    fired once. ``attempts``: child execution id -> its expected attempt count
    (default 1: a worker lost under a child makes a second attempt of the same child)."""
    ids = list(made)
    rows = {r["id"]: r for r in db.execute(
        "SELECT e.id, e.status, e.result, e.ended, w.id AS wf, w.status AS wf_status FROM execution e"
        " JOIN workflow_execution w ON w.execution = e.id WHERE e.id = ANY(%s)", (ids,)).fetchall()}  # fmt: skip
    assert set(rows) == set(ids), f"workflow executions without a workflow state: {set(ids) - set(rows)}"
    for eid, (ref, tag) in made.items():
        r = rows[eid]
        assert (r["status"], r["wf_status"]) == ("completed", "succeeded"), (eid, ref, r)
        assert r["result"] == expected_output(ref, tag), (eid, ref, r["result"])
    wfs = [r["wf"] for r in rows.values()]
    left = db.execute(
        "SELECT workflow_execution, kind, execution FROM workflow_event WHERE workflow_execution = ANY(%s)", (wfs,)
    ).fetchall()
    assert left == [], f"events never applied: {left}"

    children = db.execute(
        "SELECT c.id, c.parent, c.action_ref, c.parameters, c.status, c.attempt, c.created, p.ended AS parent_ended"
        " FROM execution c JOIN execution p ON p.id = c.parent WHERE c.parent = ANY(%s)",
        (ids,),
    ).fetchall()
    by_key = Counter((c["parent"], c["action_ref"], c["parameters"].get("message")) for c in children)
    twice = {k: n for k, n in by_key.items() if n > 1}
    assert twice == {}, f"more than one child for one (workflow, task/item): {twice}"
    for eid, (ref, _tag) in made.items():
        mine = [c for c in children if c["parent"] == eid]
        assert len(mine) == CHILDREN[ref], (eid, ref, [c["parameters"] for c in mine])
    for c in children:
        assert c["status"] == "completed", c
        assert c["created"] <= c["parent_ended"], f"child {c['id']} created after its workflow ended: {c}"
        want = (attempts or {}).get(c["id"], 1)
        assert c["attempt"] == want, f"child {c['id']} ({c['parameters']}): {c['attempt']} attempts, not {want}"

    # The engine's bookkeeping agrees: one dispatch row per chain, pointing at the child,
    # retry 0 (nothing failed), and as many children as chains.
    dispatches = db.execute(
        "SELECT w.execution AS parent, d.task_name, d.task_index, d.iteration, d.execution, d.retry, d.status"
        " FROM workflow_task_dispatch d JOIN workflow_execution w ON w.id = d.workflow_execution"
        " WHERE w.execution = ANY(%s)",
        (ids,),
    ).fetchall()
    assert sorted(d["execution"] for d in dispatches) == sorted(c["id"] for c in children), "dispatch/child mismatch"
    assert all((d["retry"], d["status"], d["iteration"]) == (0, "succeeded", 0) for d in dispatches), dispatches
    again = db.execute(
        "SELECT w.execution, t.task_name, t.iteration FROM workflow_task t"
        " JOIN workflow_execution w ON w.id = t.workflow_execution WHERE w.execution = ANY(%s) AND t.iteration > 0",
        (ids,),
    ).fetchall()
    assert again == [], f"a task entered twice (a join fired more than once): {again}"


# The workflow duty polls every 0.2 s: a replacement finds what a dead replica left at once;
# claims a dead executor left (its workflows' children, requested -> scheduling) are taken
# back after 2 s, not 30.
WORKFLOW_SETTINGS = {"CONVEYOR__WORKFLOW__POLL_INTERVAL": "0.2", "CONVEYOR__EXECUTOR__CLAIM_TIMEOUT": "2"}
