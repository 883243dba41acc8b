"""A workflow definition as a graph: its tasks (nodes) and transitions (edges), the one
shape that ``conveyor workflows get`` prints, ``GET /api/v1/workflows/{ref}`` returns and
the dashboard draws. Pure: a function of the :class:`WorkflowSpec`.

An edge is one target of one ``next`` entry (``when`` kept as written); commands in ``do``
(``fail``, ``noop``, ``continue``, ``retry``) are no task, so they are kept on the entry
(``Node.next``) rather than drawn as edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.workflows.spec import COMMANDS, WorkflowSpec


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    action: str | None
    start: bool
    join: str | int | None
    with_items: bool
    # Each ``next`` entry as (when, targets and commands in order).
    next: tuple[tuple[str | None, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    when: str | None


@dataclass(frozen=True, slots=True)
class Graph:
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "name": n.name,
                    "action": n.action,
                    "start": n.start,
                    "join": n.join,
                    "with_items": n.with_items,
                    "next": [{"when": when, "do": list(do)} for when, do in n.next],
                }
                for n in self.nodes
            ],
            "edges": [{"from": e.source, "to": e.target, "when": e.when} for e in self.edges],
        }


def graph(spec: WorkflowSpec) -> Graph:
    """The tasks in definition order, and one edge per (transition, target task)."""
    starts = set(spec.starts())
    nodes = tuple(
        Node(
            t.name,
            t.action,
            t.name in starts,
            t.join,
            t.with_items is not None,
            tuple((tr.when, tuple(tr.do)) for tr in t.next),
        )
        for t in spec.tasks.values()
    )
    edges = tuple(
        Edge(t.name, target, tr.when)
        for t in spec.tasks.values()
        for tr in t.next
        for target in tr.do
        if target not in COMMANDS and target in spec.tasks
    )
    return Graph(nodes, edges)


def describe(g: Graph) -> list[str]:
    """The graph as text, one line per task then one per transition, for a terminal:

    build  (core.local)  start
      when <% succeeded() %> -> deploy, notify
      when <% failed() %> -> fail
    """
    lines: list[str] = []
    for n in g.nodes:
        marks = [m for m in ("start" if n.start else "", "with items" if n.with_items else "") if m]
        if n.join is not None:
            marks.append(f"join {n.join}")
        suffix = f"  {', '.join(marks)}" if marks else ""
        lines.append(f"{n.name}  ({n.action or 'no action'}){suffix}")
        for when, do in n.next:
            lines.append(f"  {'when ' + when if when else 'always'} -> {', '.join(do) if do else '(nothing)'}")
    return lines
