"""The dashboard's SVG charts (charts.py): pure functions from numbers to markup."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from conveyor.api.dashboard import charts
from conveyor.api.dashboard.charts import Series

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TIMES = [T0 + timedelta(minutes=i) for i in range(60)]


def parse(markup: Markup) -> ET.Element:
    """The figure as XML: the markup must be well-formed (a browser is forgiving; this is not)."""
    return ET.fromstring(str(markup))


def svg_of(figure: ET.Element) -> ET.Element:
    svg = figure.find(f"{SVG}svg")
    assert svg is not None
    return svg


def marks(figure: ET.Element, tag: str, kind: str) -> list[ET.Element]:
    """The chart's marks of one series: bars (rect), lines (polyline) or dots (circle)."""
    prefix = {"rect": "bar", "polyline": "line", "circle": "dot"}[tag]
    return [e for e in svg_of(figure).iter(f"{SVG}{tag}") if f"{prefix}-{kind}" in (e.get("class") or "").split()]


def test_time_bars_draw_one_stacked_column_per_bucket_with_its_numbers() -> None:
    completed = [0] * 60
    failed = [0] * 60
    completed[3], failed[3], completed[59] = 7, 2, 4
    series = [Series("completed", "completed", completed), Series("failed", "failed", failed)]
    figure = parse(charts.time_bars("throughput", "Finished per minute", "desc", TIMES, series))
    assert figure.get("id") == "chart-throughput"
    bars = marks(figure, "rect", "completed")
    assert [(b.get("data-time"), b.get("data-value")) for b in bars] == [("12:03", "7"), ("12:59", "4")]
    (red,) = marks(figure, "rect", "failed")
    assert (red.get("data-time"), red.get("data-value")) == ("12:03", "2")
    # Stacked: the failed part sits on top of the completed part of the same minute.
    assert float(red.get("y") or 0) + float(red.get("height") or 0) == pytest.approx(float(bars[0].get("y") or 0))
    assert float(red.get("x") or 0) == float(bars[0].get("x") or 0)
    # The tallest column reaches the scale's top (9 -> ticks 0..10 by 2 here, or close to it).
    assert float(bars[0].get("height") or 0) > float(bars[1].get("height") or 0)
    # Every mark says what it is, for a pointer and for a screen reader.
    title = red.find(f"{SVG}title")
    assert title is not None
    assert title.text == "12:03 UTC · failed: 2"
    svg = svg_of(figure)
    assert svg.get("role") == "img"
    assert svg.get("aria-labelledby") == "throughput-title throughput-desc"
    assert svg.find(f"{SVG}title").text == "Finished per minute"  # type: ignore[union-attr]
    # Time labels every 10 minutes, and the last minute's.
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.get("text-anchor") == "middle"]
    assert labels == ["12:00", "12:10", "12:20", "12:30", "12:40", "12:50", "12:59"]
    # The numbers as a table: the minutes that had any.
    rows = [[c.text for c in tr] for tr in figure.iter("tr")]
    assert rows == [["minute (UTC)", "completed", "failed"], ["12:03", "7", "2"], ["12:59", "4", "0"]]


def test_lines_break_where_a_minute_has_no_value_and_dots_carry_the_values() -> None:
    p50: list[float | None] = [None] * 60
    p50[10], p50[11], p50[12], p50[40] = 0.5, 1.5, 0.25, 2.0
    figure = parse(charts.time_lines("latency", "Request to start", "desc", TIMES, [Series("p50", "p50", p50)],
                                     fmt=lambda v: f"{v:.2f} s"))  # fmt: skip
    lines = marks(figure, "polyline", "p50")
    assert len(lines) == 1  # 10-12 joined; 40 alone is a dot only
    assert len((lines[0].get("points") or "").split()) == 3
    dots = marks(figure, "circle", "p50")
    assert [(d.get("data-time"), d.get("data-value")) for d in dots] == [
        ("12:10", "0.50 s"), ("12:11", "1.50 s"), ("12:12", "0.25 s"), ("12:40", "2.00 s")]  # fmt: skip
    # Higher values are drawn higher (smaller y).
    ys = [float(d.get("cy") or 0) for d in dots]
    assert ys[1] < ys[0] < ys[2]
    assert ys[3] < ys[1]


def test_category_bars_escape_names_and_say_when_nothing_waits() -> None:
    hostile = "pack.<script>alert('x')</script>&"
    series = [Series("requested", "requested", [3, 0]), Series("scheduled", "scheduled", [1, 5])]
    markup = charts.category_bars("queue", "Queue depth", "waiting <now>", [hostile, "core.echo"], series)
    assert "<script>" not in markup
    assert "&lt;script&gt;" in markup
    assert "waiting &lt;now&gt;" in markup
    figure = parse(markup)
    requested = marks(figure, "rect", "requested")
    assert [(b.get("data-label"), b.get("data-value")) for b in requested] == [(hostile, "3")]
    scheduled = marks(figure, "rect", "scheduled")
    assert [(b.get("data-label"), b.get("data-value")) for b in scheduled] == [(hostile, "1"), ("core.echo", "5")]
    # The first action's scheduled part starts where its requested part ends.
    assert float(scheduled[0].get("x") or 0) == pytest.approx(
        float(requested[0].get("x") or 0) + float(requested[0].get("width") or 0))  # fmt: skip

    empty = parse(charts.category_bars("queue", "Queue depth", "d", [], [Series("requested", "requested", [])]))
    assert "nothing waiting" in [t.text for t in svg_of(empty).iter(f"{SVG}text")]
    assert [c.text for c in empty.iter("td")] == ["nothing to show"]


def test_titles_are_escaped_and_keys_must_be_safe_ids() -> None:
    markup = charts.time_bars("x", 'a "quoted" <b>title</b>', "d", TIMES[:2], [Series("n", "completed", [1, 2])])
    assert "<b>" not in markup
    assert parse(markup).find("figcaption").text == 'a "quoted" <b>title</b>'  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="chart key"):
        charts.time_bars('x" onload="evil', "t", "d", TIMES[:1], [Series("n", "completed", [1])])


@pytest.mark.parametrize(
    ("top", "integer", "ticks"),
    [
        (0, True, [0, 1]),
        (1, True, [0, 1]),
        (9, True, [0, 5, 10]),
        (37, True, [0, 10, 20, 30, 40]),
        (0.3, False, [0, 0.1, 0.2, 0.3]),
        (2.4, False, [0, 1, 2, 3]),
        (float("nan"), False, [0, 1]),
    ],
)
def test_scale_covers_the_top_in_round_steps(top: float, integer: bool, ticks: list[float]) -> None:
    assert charts.scale(top, integer) == pytest.approx(ticks)
