"""Workflows in a chaos run: three small definitions (registered once the database is
migrated), the share of the load they take, and their invariants at the end.

Each child runs ``chaos.step`` with the workflow's submission number ``n`` and a
``step`` naming its task (and item), so a duplicate child is visible in ``execution``
itself, besides the engine's own bookkeeping (``workflow_task_dispatch``).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.domain.errors import ConveyorError
from conveyor.sdk import Client
from conveyor.workflows.parse import parse_workflow

SCHEMA = "conveyor"

Conn = psycopg.Connection[dict[str, Any]]

# n -> s0 -> s1 -> s2, each publishing what it returned: the output proves the order.
SEQUENCE = """
ref: chaos.wf_sequence
input: [n]
vars:
  - seen: []
tasks:
  s0:
    action: chaos.step n=<% ctx(n) %> step=s0
    next:
      - when: <% succeeded() %>
        publish:
          - seen: <% ctx(seen) + [result().step] %>
        do: s1
  s1:
    action: chaos.step n=<% ctx(n) %> step=s1
    next:
      - when: <% succeeded() %>
        publish:
          - seen: <% ctx(seen) + [result().step] %>
        do: s2
  s2:
    action: chaos.step n=<% ctx(n) %> step=s2
    next:
      - when: <% succeeded() %>
        publish:
          - seen: <% ctx(seen) + [result().step] %>
output:
  - seen: <% ctx(seen) %>
"""

# One task over six items, two at a time.
ITEMS = """
ref: chaos.wf_items
input: [n]
tasks:
  each:
    with:
      items: i in <% [0, 1, 2, 3, 4, 5] %>
      concurrency: 2
    action: chaos.step n=<% ctx(n) %> step="item-<% item(i) %>"
    next:
      - when: <% succeeded() %>
        publish:
          - steps: <% result().select($.step) %>
output:
  - steps: <% ctx(steps) %>
"""

# fan out to three branches, join: all, then one more step.
JOIN = """
ref: chaos.wf_join
input: [n]
tasks:
  fan:
    action: chaos.step n=<% ctx(n) %> step=fan
    next:
      - do: a, b, c
  a:
    action: chaos.step n=<% ctx(n) %> step=a
    next:
      - do: joined
  b:
    action: chaos.step n=<% ctx(n) %> step=b
    next:
      - do: joined
  c:
    action: chaos.step n=<% ctx(n) %> step=c
    next:
      - do: joined
  joined:
    join: all
    action: chaos.step n=<% ctx(n) %> step=joined
    next:
      - when: <% succeeded() %>
        publish:
          - last: <% result().step %>
output:
  - last: <% ctx(last) %>
"""

# An inquiry (core.ask: pending, no worker) answered by the harness's bot (InquiryBot),
# then one more step with the answer.
ASK = """
ref: chaos.wf_ask
input: [n]
tasks:
  ask:
    action: core.ask
    input:
      prompt: approve <% ctx(n) %>?
      schema:
        type: object
        properties:
          n: {type: integer}
        required: [n]
    next:
      - when: <% succeeded() %>
        publish:
          - answered: <% result().response.n %>
        do: after
  after:
    action: chaos.step n=<% ctx(n) %> step=after
output:
  - answered: <% ctx(answered) %>
"""

SOURCES = {"chaos.wf_sequence": SEQUENCE, "chaos.wf_items": ITEMS, "chaos.wf_join": JOIN, "chaos.wf_ask": ASK}
OUTPUTS: dict[str, Any] = {
    "chaos.wf_sequence": {"seen": ["s0", "s1", "s2"]},
    "chaos.wf_items": {"steps": [f"item-{i}" for i in range(6)]},
    "chaos.wf_join": {"last": "joined"},
    # chaos.wf_ask: {"answered": n}, checked per execution (its n)
}
# (weight, ref) added to the load's mix: about 7 % of the requests are workflows.
MIX: list[tuple[int, str]] = [(3, "chaos.wf_sequence"), (2, "chaos.wf_items"), (2, "chaos.wf_join"),
                              (1, "chaos.wf_ask")]  # fmt: skip


class InquiryBot(threading.Thread):
    """Answers every pending inquiry every ``every`` seconds through the SDK
    (``Client.respond``: the schema checked, then the SQL function ``respond_inquiry``),
    with the workflow's ``n``; sometimes twice (the second answer must be refused:
    already answered), as racing humans would."""

    def __init__(self, url: str, every: float = 0.3) -> None:
        super().__init__(name="chaos-inquiry-bot", daemon=True)
        self.url, self.every = url, every
        self.stop = threading.Event()
        self.results: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        client: Client | None = None
        try:
            while not self.stop.wait(self.every):
                try:
                    client = client or Client(self.url, SCHEMA)
                    self._answer(client)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    self.results["database unreachable"] += 1
                    if client is not None:
                        client.close()
                    client = None
        except BaseException as exc:  # reported by the harness
            self.error = exc
        finally:
            if client is not None:
                client.close()

    def _answer(self, client: Client) -> None:
        pending = client.conn.execute(
            "SELECT i.id, (p.parameters ->> 'n')::int AS n FROM inquiry i JOIN execution e ON e.id = i.execution"
            " JOIN execution p ON p.id = e.parent WHERE i.status = 'pending' ORDER BY i.id LIMIT 20"
        ).fetchall()
        for row in pending:
            for responder in ("bot", "bot") if row["id"] % 3 == 0 else ("bot",):
                try:
                    outcome = client.respond(row["id"], {"n": row["n"]}, responder=responder)["outcome"]
                except ConveyorError as exc:  # cancelled meanwhile, or answered already
                    outcome = type(exc).__name__
                self.results[outcome] += 1


def register(conn: Conn) -> None:
    """Register the workflows as the CLI does (their actions exist: the workers
    registered the chaos pack before this runs)."""
    for ref, text in SOURCES.items():
        spec = parse_workflow(text)
        assert spec.ref == ref
        conn.execute(
            "SELECT register_workflow(%s, %s, %s, %s, %s)",
            (spec.ref, Jsonb(spec.to_json()), text, spec.description, Jsonb(spec.parameters_schema)),
        )


def _short(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items())


WORKFLOWS = """
SELECT e.id, e.action_ref, e.status, e.result, e.ended, e.parameters ->> 'n' AS n, w.id AS wf, w.status AS wf_status,
       (SELECT count(*) FROM workflow_event ev WHERE ev.workflow_execution = w.id) AS events
FROM execution e JOIN action a ON a.ref = e.action_ref
LEFT JOIN workflow_execution w ON w.execution = e.id
WHERE a.runner_type = 'workflow'
"""
CHILDREN = """
SELECT c.id, c.parent, c.action_ref, coalesce(c.parameters ->> 'step', 'ask') AS step, c.status, c.created,
       p.ended AS parent_ended  -- core.ask (chaos.wf_ask's task 'ask') is the one child without a step
FROM execution c JOIN execution p ON p.id = c.parent
"""
DISPATCHES = """
SELECT w.execution AS parent, d.task_name, d.task_index, d.iteration, d.execution, d.retry
FROM workflow_task_dispatch d JOIN workflow_execution w ON w.id = d.workflow_execution
"""
# Workflow status -> the execution status it ends its execution with.
ENDS = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}


def run_checks(conn: Conn, report: Any) -> None:
    """The workflow invariants (docs/chaos.md): every workflow terminal with its state
    agreeing and nothing left to apply, one child per (task, item, retry) chain, each join
    fired once, no child created after its workflow ended; and the succeeded ones with
    the output of a run without faults."""
    wfs = conn.execute(WORKFLOWS).fetchall()
    children = conn.execute(CHILDREN).fetchall()
    dispatches = conn.execute(DISPATCHES).fetchall()
    by_status = Counter(f"{w['action_ref'].removeprefix('chaos.')} {w['status']}" for w in wfs)

    stuck = [w for w in wfs if w["status"] in ("requested", "scheduling", "running", "paused", "canceling")]
    problems = [f"not terminal: {_short(w)}" for w in stuck]
    for w in wfs:
        if w["wf"] is None:
            continue  # never started (cancelled or failed before its start): no state
        if w["status"] not in ENDS.values() or ENDS.get(w["wf_status"]) != w["status"]:
            problems.append(f"execution and workflow state disagree: {_short(w)}")
        if w["events"]:
            problems.append(f"events left unapplied: {_short(w)}")
    summary = f"{len(wfs)} workflows: " + ", ".join(f"{k} {n}" for k, n in sorted(by_status.items()))
    report.check("every workflow execution terminal, its state agreeing, nothing left to apply", problems, summary)

    def faultless(w: dict[str, Any]) -> Any:
        return {"answered": int(w["n"])} if w["action_ref"] == "chaos.wf_ask" else OUTPUTS.get(w["action_ref"])

    wrong = [
        f"execution {w['id']} ({w['action_ref']} n={w['n']}) output {w['result']}, not {faultless(w)}"
        for w in wfs
        if w["status"] == "completed" and w["result"] != faultless(w)
    ]
    report.check("every completed workflow has the output of a run without faults", wrong)
    inquiries = conn.execute(
        "SELECT i.id, i.status, e.status AS execution_status, (SELECT count(*) FROM inquiry_response r"
        " WHERE r.inquiry = i.id) AS answers FROM inquiry i JOIN execution e ON e.id = i.execution"
    ).fetchall()
    problems = [f"inquiry not closed: {_short(i)}" for i in inquiries if i["status"] == "pending"]
    problems += [f"answered more than once (quorum 1): {_short(i)}" for i in inquiries if i["answers"] > 1]
    problems += [f"responded, but its execution did not complete: {_short(i)}" for i in inquiries
                 if i["status"] == "responded" and i["execution_status"] != "completed"]  # fmt: skip
    summary = ", ".join(f"{k} {n}" for k, n in sorted(Counter(i["status"] for i in inquiries).items()))
    report.check("every inquiry closed, answered once", problems, summary or "none asked")

    chains: dict[tuple[int, str], int] = {}  # (parent, step) -> children the chain may have
    current: set[int] = set()
    for d in dispatches:
        step = d["task_name"] if d["task_index"] is None else f"item-{d['task_index']}"
        chains[(d["parent"], step)] = chains.get((d["parent"], step), 0) + d["retry"] + 1
        if d["execution"] is not None:
            current.add(d["execution"])
    made: Counter[tuple[int, str]] = Counter((c["parent"], c["step"]) for c in children)
    problems = [
        f"workflow {parent} step {step}: {n} children for a chain allowing {chains.get((parent, step), 0)}"
        for (parent, step), n in sorted(made.items())
        if n > chains.get((parent, step), 0)
    ]
    problems += [f"a child no dispatch row accounts for: {_short(c)}"
                 for c in children if (c["parent"], c["step"]) not in chains]  # fmt: skip
    problems += [f"a dispatch whose child is not the workflow's: {d}" for d in dispatches
                 if d["execution"] is not None and d["execution"] not in {c["id"] for c in children}]  # fmt: skip
    report.check("one child per (task, item, retry) chain", problems,
                 f"{len(children)} children in {len(chains)} chains")  # fmt: skip

    again = conn.execute(
        "SELECT w.execution, t.task_name, t.iteration FROM workflow_task t"
        " JOIN workflow_execution w ON w.id = t.workflow_execution WHERE t.iteration > 0"
    ).fetchall()
    report.check("each join fired once (no task entered twice: these workflows have no cycle)",
                 [_short(r) for r in again])  # fmt: skip

    late = [c for c in children if c["parent_ended"] is not None and c["created"] > c["parent_ended"]]
    per_parent: dict[int, list[Any]] = defaultdict(list)
    for c in late:
        per_parent[c["parent"]].append(c["id"])
    report.check("no task child created after its workflow execution ended",
                 [f"workflow {p}: children {ids}" for p, ids in sorted(per_parent.items())])  # fmt: skip
