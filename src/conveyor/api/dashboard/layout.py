"""Where the dashboard draws a workflow's tasks: layers from the start tasks downwards, as an
inline SVG (no script, no library: the page's content security policy allows neither
inline script nor third-party code, and the live refresh patches the SVG like any HTML).

Pure: ``layout(graph)`` gives boxes and edge paths in pixels. A task's layer is the length
of the longest path to it from a start task over forward edges, so a join sits below every
branch it waits for. Edges that close a cycle (found by a depth-first walk from the start
tasks in definition order) are drawn back up along the right-hand side and left out of the
layering -- otherwise a cycle would have no layering at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.workflows.graph import Graph

NODE_W = 180
NODE_H = 38
GAP_X = 28
GAP_Y = 54
MARGIN = 12
BULGE = 44  # room on the right for edges drawn back up
PAD_X = 6  # room between a box's side and its text
FONT_NAME = 12.0  # px: a task's name (bold), .wf-graph's font-size in dashboard.css
FONT_NOTE = 11.0  # px: the note under it, .wf-note's
# Advance widths in em, each group's widest in DejaVu Sans Bold -- the widest common sans-serif
# face, the one Debian's Chromium draws system-ui with -- so that text cut to fit by these
# figures fits whatever face the browser picks (a count of characters did not: 22 wide
# letters ran out of the box). Anything else (another script, a symbol) counts 1.1 em.
_EM = {
    **dict.fromkeys("'ijl.,:;|/\\IJ ·", 0.40),
    **dict.fromkeys('-ft!()[]r_`"*', 0.52),
    **dict.fromkeys("abcdeghknopqsuvxyz0123456789$?{}", 0.73),
    **dict.fromkeys("ABCDEFGHKLNOPQRSTUVXYZ#+<=>^~&×", 0.87),
    "w": 0.92,
    **dict.fromkeys("mM%@…", 1.04),
}


@dataclass(frozen=True, slots=True)
class Box:
    name: str
    label: str
    action: str | None
    layer: int
    x: float
    y: float
    w: float = NODE_W
    h: float = NODE_H

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


@dataclass(frozen=True, slots=True)
class Line:
    source: str
    target: str
    path: str  # SVG path data
    back: bool  # closes a cycle: drawn on the right, back up


@dataclass(frozen=True, slots=True)
class Layout:
    width: float
    height: float
    boxes: tuple[Box, ...]
    lines: tuple[Line, ...]


def _back_edges(names: list[str], succ: dict[str, list[str]], roots: list[str]) -> set[tuple[str, str]]:
    """Edges to a task still on the depth-first stack: they close a cycle. Iterative, so a
    long chain cannot exhaust Python's recursion limit."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    back: set[tuple[str, str]] = set()
    for root in [*roots, *names]:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(succ[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(succ[child])))
    return back


def _layers(names: list[str], forward: dict[str, list[str]]) -> dict[str, int]:
    """Longest path from a source over the forward (acyclic) edges (Kahn's order)."""
    indegree = dict.fromkeys(names, 0)
    for targets in forward.values():
        for t in targets:
            indegree[t] += 1
    layer = dict.fromkeys(names, 0)
    ready = [n for n in names if indegree[n] == 0]
    while ready:
        node = ready.pop(0)
        for t in forward[node]:
            layer[t] = max(layer[t], layer[node] + 1)
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    return layer


def text_width(text: str, size: float) -> float:
    """An upper bound of ``text``'s width in pixels at font size ``size`` (see _EM)."""
    return size * sum(_EM.get(ch, 1.1) for ch in text)


def fit(text: str, width: float, size: float) -> str:
    """``text``, or as much of it as fits in ``width`` pixels followed by "…" (the whole
    text is the box's tooltip)."""
    if text_width(text, size) <= width:
        return text
    room, used, kept = width - text_width("…", size), 0.0, 0
    for ch in text:
        used += size * _EM.get(ch, 1.1)
        if used > room:
            break
        kept += 1
    return text[:kept] + "…"


def _path(a: Box, b: Box, back: bool) -> str:
    if a.name == b.name:  # a task that starts itself again: a loop on its right side
        x, y = a.x + a.w, a.y
        return f"M{x:g},{y + a.h * 0.3:g} C{x + 34:g},{y - 8:g} {x + 34:g},{y + a.h + 8:g} {x:g},{y + a.h * 0.7:g}"
    if back:  # out of the right side, round and into the target's right side
        x1, y1, x2, y2 = a.x + a.w, a.y + a.h / 2, b.x + b.w, b.y + b.h / 2
        reach = max(x1, x2) + BULGE - 8
        return f"M{x1:g},{y1:g} C{reach:g},{y1:g} {reach:g},{y2:g} {x2:g},{y2:g}"
    x1, y1, x2, y2 = a.cx, a.y + a.h, b.cx, b.y
    bend = (y2 - y1) / 2
    return f"M{x1:g},{y1:g} C{x1:g},{y1 + bend:g} {x2:g},{y2 - bend:g} {x2:g},{y2:g}"


def layout(graph: Graph) -> Layout:
    names = [n.name for n in graph.nodes]
    succ: dict[str, list[str]] = {n: [] for n in names}
    for e in graph.edges:
        if e.source in succ and e.target in succ and e.target not in succ[e.source]:
            succ[e.source].append(e.target)
    back = _back_edges(names, succ, [n.name for n in graph.nodes if n.start])
    forward = {n: [t for t in succ[n] if (n, t) not in back] for n in names}
    layer = _layers(names, forward)

    # Rows: the first in definition order, each next one by the mean position of its
    # tasks' parents (fewer crossings), ties in definition order.
    depth = max(layer.values(), default=-1) + 1
    rows: list[list[str]] = [[n for n in names if layer[n] == i] for i in range(depth)]
    order = {n: i for i, n in enumerate(names)}
    parents: dict[str, list[str]] = {n: [] for n in names}
    for s, targets in forward.items():
        for t in targets:
            parents[t].append(s)
    position: dict[str, float] = {}
    for i, row in enumerate(rows):
        if i > 0:
            row.sort(
                key=lambda n: (
                    sum(position[p] for p in parents[n]) / len(parents[n]) if parents[n] else float("inf"),
                    order[n],
                )
            )
        position.update((n, float(k)) for k, n in enumerate(row))

    widest = max((len(r) for r in rows), default=0)
    inner = widest * NODE_W + max(widest - 1, 0) * GAP_X
    action = {n.name: n.action for n in graph.nodes}
    boxes: dict[str, Box] = {}
    for i, row in enumerate(rows):
        span = len(row) * NODE_W + (len(row) - 1) * GAP_X
        left = MARGIN + (inner - span) / 2
        for k, n in enumerate(row):
            boxes[n] = Box(
                n,
                fit(n, NODE_W - 2 * PAD_X, FONT_NAME),
                action[n],
                i,
                left + k * (NODE_W + GAP_X),
                MARGIN + i * (NODE_H + GAP_Y),
            )
    lines = tuple(Line(s, t, _path(boxes[s], boxes[t], (s, t) in back), (s, t) in back) for s in names for t in succ[s])
    width = MARGIN * 2 + inner + BULGE
    height = MARGIN * 2 + depth * NODE_H + max(depth - 1, 0) * GAP_Y
    return Layout(width, height, tuple(boxes[n] for n in names), lines)
