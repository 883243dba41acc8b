"""Charts as inline SVG, drawn on the server: no script library and nothing from another
site, so a chart shows wherever the page does (the pages' Content-Security-Policy forbids
inline ``style`` attributes: colours and sizes are SVG presentation attributes).

Pure: values in, ``Markup`` out. Every text (titles, action names, labels) goes through
``markupsafe.escape`` in ``_el``, the one place that writes markup; numbers are formatted
here. Each chart is a ``<figure>`` with an SVG (``role="img"``, a ``<title>`` and a
``<desc>`` for screen readers, a ``<title>`` tooltip on every bar and point, each mark's
number in ``data-value``) and its numbers as a table under a ``<details>``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 14, 30  # the plot area's margins: axis labels live there
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
GRID = "#e3e7ee"
MUTED = "#667085"
# One colour per series kind: the legend, the bars and the table's swatches agree.
COLOURS = {
    "completed": "#137333",
    "failed": "#b3261e",
    "p50": "#2457c5",
    "p95": "#b25e09",
    "requested": "#5f6b7a",
    "scheduled": "#2457c5",
}
_KEY = re.compile(r"^[a-z][a-z0-9-]*$")

Format = Callable[[float], str]


@dataclass(frozen=True, slots=True)
class Series:
    """One named row of values, a value per bucket (None: nothing to show there)."""

    name: str
    kind: str  # a key of COLOURS, also the marks' class suffix
    values: Sequence[float | None]


def count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _el(tag: str, attrs: dict[str, object] | None = None, *children: object) -> Markup:
    """An element: attribute values and text children escaped, ``Markup`` children kept."""
    parts = "".join(f' {name}="{escape(str(value))}"' for name, value in (attrs or {}).items() if value is not None)
    inner = "".join(str(child) if isinstance(child, Markup) else str(escape(str(child))) for child in children)
    return Markup(f"<{tag}{parts}>{inner}</{tag}>")


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def scale(top: float, integer: bool = False) -> list[float]:
    """Tick values from 0 to at least ``top``, in 1-2-5 steps (whole steps for counts)."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    ticks = [0.0]
    while ticks[-1] < top:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _y(value: float, top: float) -> float:
    return TOP + PLOT_H - (value / top) * PLOT_H


def _frame(key: str, title: str, desc: str, ticks: list[float], fmt: Format, body: list[Markup]) -> Markup:
    """The SVG: accessible name and description, horizontal grid lines with their values."""
    top = ticks[-1]
    grid: list[Markup] = []
    for tick in ticks:
        y = _num(_y(tick, top))
        grid.append(_el("line", {"x1": LEFT, "x2": WIDTH - RIGHT, "y1": y, "y2": y, "stroke": GRID}))
        grid.append(
            _el(
                "text",
                {"x": LEFT - 6, "y": y, "dy": "0.32em", "text-anchor": "end", "font-size": 11, "fill": MUTED},
                fmt(tick),
            )
        )
    return _el(
        "svg",
        {
            "viewBox": f"0 0 {WIDTH} {HEIGHT}",
            "width": "100%",
            "role": "img",
            "aria-labelledby": f"{key}-title {key}-desc",
            "class": "chart-svg",
            "xmlns": "http://www.w3.org/2000/svg",
            "font-family": "system-ui, sans-serif",
        },
        _el("title", {"id": f"{key}-title"}, title),
        _el("desc", {"id": f"{key}-desc"}, desc),
        *grid,
        *body,
    )


def _legend(series: Sequence[Series]) -> Markup:
    items = [
        _el(
            "li",
            {"class": f"legend-{s.kind}"},
            Markup('<svg viewBox="0 0 10 10" width="10" height="10" aria-hidden="true">')
            + _el("rect", {"width": 10, "height": 10, "fill": COLOURS.get(s.kind, MUTED)})
            + Markup("</svg> "),
            s.name,
        )
        for s in series
    ]
    return _el("ul", {"class": "chart-legend"}, *items)


def _table(key: str, caption: str, head: str, labels: Sequence[str], series: Sequence[Series], fmt: Format) -> Markup:
    """The numbers behind the chart, for reading and for screen readers: rows with any value."""
    rows = []
    for i, label in enumerate(labels):
        cells = [s.values[i] for s in series]
        if all(v is None or v == 0 for v in cells):
            continue
        rows.append(
            _el(
                "tr",
                None,
                _el("th", {"scope": "row"}, label),
                *(_el("td", {"class": "num"}, "—" if v is None else fmt(v)) for v in cells),
            )
        )
    if not rows:
        rows.append(_el("tr", None, _el("td", {"colspan": len(series) + 1, "class": "muted"}, "nothing to show")))
    header = _el(
        "tr",
        None,
        _el("th", {"scope": "col"}, head),
        *(_el("th", {"scope": "col", "class": "num"}, s.name) for s in series),
    )
    return _el(
        "details",
        {"class": "chart-numbers", "id": f"{key}-numbers"},
        _el("summary", None, "Numbers"),
        _el(
            "table",
            {"class": "list"},
            _el("caption", None, caption),
            _el("thead", None, header),
            _el("tbody", None, *rows),
        ),
    )


def _figure(key: str, title: str, svg: Markup, series: Sequence[Series], table: Markup) -> Markup:
    if not _KEY.match(key):
        raise ValueError(f"chart key {key!r}: lower-case letters, digits and dashes")
    return _el(
        "figure", {"class": "chart", "id": f"chart-{key}"}, _el("figcaption", None, title), svg, _legend(series), table
    )


def minute(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M")


def _time_axis(times: Sequence[datetime], every: int) -> list[Markup]:
    """HH:MM (UTC, as every time on the dashboard) under every ``every``-th bucket and the last."""
    marks: list[Markup] = []
    slot = PLOT_W / max(1, len(times))
    for i, at in enumerate(times):
        if i % every and i != len(times) - 1:
            continue
        if i != len(times) - 1 and len(times) - 1 - i < every // 2:
            continue  # too close to the last label: they would overlap
        x = _num(LEFT + slot * (i + 0.5))
        marks.append(
            _el("text", {"x": x, "y": HEIGHT - 10, "text-anchor": "middle", "font-size": 11, "fill": MUTED}, minute(at))
        )
    return marks


def time_bars(
    key: str,
    title: str,
    desc: str,
    times: Sequence[datetime],
    series: Sequence[Series],
    fmt: Format = count,
    every: int = 10,
) -> Markup:
    """Stacked bars, one column per time bucket (the buckets are contiguous and in order)."""
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(times))]
    ticks = scale(max(totals, default=0), integer=True)
    slot = PLOT_W / max(1, len(times))
    body: list[Markup] = []
    for i, at in enumerate(times):
        base = 0.0
        for s in series:
            value = s.values[i] or 0
            if value <= 0:
                continue
            y0, y1 = _y(base, ticks[-1]), _y(base + value, ticks[-1])
            tip = f"{minute(at)} UTC · {s.name}: {fmt(value)}"
            body.append(
                _el(
                    "rect",
                    {
                        "class": f"bar bar-{s.kind}",
                        "x": _num(LEFT + slot * i + slot * 0.1),
                        "y": _num(y1),
                        "width": _num(slot * 0.8),
                        "height": _num(y0 - y1),
                        "fill": COLOURS.get(s.kind, MUTED),
                        "data-value": fmt(value),
                        "data-time": minute(at),
                    },
                    _el("title", None, tip),
                )
            )
            base += value
    body += _time_axis(times, every)
    labels = [minute(t) for t in times]
    svg = _frame(key, title, desc, ticks, fmt, body)
    return _figure(key, title, svg, series, _table(key, title, "minute (UTC)", labels, series, fmt))


def time_lines(
    key: str,
    title: str,
    desc: str,
    times: Sequence[datetime],
    series: Sequence[Series],
    fmt: Format = count,
    every: int = 10,
) -> Markup:
    """Lines over time buckets, broken where a bucket has no value, with a dot (and its
    tooltip) on every value."""
    present = [v for s in series for v in s.values if v is not None]
    ticks = scale(max(present, default=0))
    slot = PLOT_W / max(1, len(times))
    body: list[Markup] = []
    for s in series:
        colour = COLOURS.get(s.kind, MUTED)
        runs: list[list[str]] = [[]]
        for i, value in enumerate(s.values):
            if value is None:
                runs.append([])
                continue
            x, y = _num(LEFT + slot * (i + 0.5)), _num(_y(value, ticks[-1]))
            runs[-1].append(f"{x},{y}")
            tip = f"{minute(times[i])} UTC · {s.name}: {fmt(value)}"
            body.append(
                _el(
                    "circle",
                    {
                        "class": f"dot dot-{s.kind}",
                        "cx": x,
                        "cy": y,
                        "r": 2.5,
                        "fill": colour,
                        "data-value": fmt(value),
                        "data-time": minute(times[i]),
                    },
                    _el("title", None, tip),
                )
            )
        for run in runs:
            if len(run) > 1:
                body.insert(
                    0,
                    _el(
                        "polyline",
                        {
                            "class": f"line line-{s.kind}",
                            "points": " ".join(run),
                            "fill": "none",
                            "stroke": colour,
                            "stroke-width": 1.5,
                        },
                    ),
                )
    body += _time_axis(times, every)
    svg = _frame(key, title, desc, ticks, fmt, body)
    return _figure(key, title, svg, series, _table(key, title, "minute (UTC)", [minute(t) for t in times], series, fmt))


def category_bars(
    key: str, title: str, desc: str, labels: Sequence[str], series: Sequence[Series], fmt: Format = count
) -> Markup:
    """Horizontal stacked bars, one row per label (an action's ref), scale along the top."""
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(labels))]
    ticks = scale(max(totals, default=0), integer=True)
    row = 22
    height = TOP + BOTTOM + row * max(1, len(labels))
    left, width = 200, WIDTH - 200 - RIGHT  # room for the action names
    body: list[Markup] = []
    for tick in ticks:
        x = _num(left + tick / ticks[-1] * width)
        body.append(_el("line", {"x1": x, "x2": x, "y1": TOP, "y2": height - BOTTOM, "stroke": GRID}))
        body.append(
            _el("text", {"x": x, "y": height - 10, "text-anchor": "middle", "font-size": 11, "fill": MUTED}, fmt(tick))
        )
    for i, label in enumerate(labels):
        y = TOP + row * i
        shown = label if len(label) <= 30 else label[:29] + "…"
        body.append(
            _el(
                "text",
                {
                    "x": left - 6,
                    "y": _num(y + row / 2),
                    "dy": "0.32em",
                    "text-anchor": "end",
                    "font-size": 12,
                    "fill": "#1d2430",
                },
                _el("title", None, label),
                shown,
            )
        )
        base = 0.0
        for s in series:
            value = s.values[i] or 0
            if value <= 0:
                continue
            x0, w = left + base / ticks[-1] * width, value / ticks[-1] * width
            body.append(
                _el(
                    "rect",
                    {
                        "class": f"bar bar-{s.kind}",
                        "x": _num(x0),
                        "y": _num(y + 3),
                        "width": _num(w),
                        "height": row - 6,
                        "fill": COLOURS.get(s.kind, MUTED),
                        "data-value": fmt(value),
                        "data-label": label,
                    },
                    _el("title", None, f"{label} · {s.name}: {fmt(value)}"),
                )
            )
            base += value
    if not labels:
        body.append(
            _el(
                "text",
                {
                    "x": left + width / 2,
                    "y": TOP + row / 2,
                    "dy": "0.32em",
                    "text-anchor": "middle",
                    "font-size": 12,
                    "fill": MUTED,
                },
                "nothing waiting",
            )
        )
    svg = _el(
        "svg",
        {
            "viewBox": f"0 0 {WIDTH} {height}",
            "width": "100%",
            "role": "img",
            "aria-labelledby": f"{key}-title {key}-desc",
            "class": "chart-svg",
            "xmlns": "http://www.w3.org/2000/svg",
            "font-family": "system-ui, sans-serif",
        },
        _el("title", {"id": f"{key}-title"}, title),
        _el("desc", {"id": f"{key}-desc"}, desc),
        *body,
    )
    return _figure(key, title, svg, series, _table(key, title, "action", labels, series, fmt))
