"""Every metric the code exports has a row in docs/runbook.md's metrics table: an
operator reading an alert finds what it means. (The automation counters -- webhook
requests, events processed, enforcements by outcome, schedule lag, slots by outcome --
were exported without one.)"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

import conveyor.ops.metrics  # noqa: F401  (registers the process's collectors)

ROOT = Path(__file__).resolve().parents[2]


def exported() -> set[str]:
    names = {m.name for c in list(REGISTRY._collector_to_names) for m in c.collect() if m.name.startswith("conveyor_")}
    # Gauges read from the database are custom collectors the executor registers.
    for path in (ROOT / "src/conveyor").rglob("*.py"):
        names |= set(re.findall(r'GaugeMetricFamily\(\s*"(conveyor_\w+)"', path.read_text()))
    return {n.removesuffix("_total") for n in names}


def documented() -> set[str]:
    text = (ROOT / "docs/runbook.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `conveyor_")]
    return {n.removesuffix("_total") for row in rows for n in re.findall(r"`(conveyor_\w+)", row.split("|")[1])}


def test_every_exported_metric_is_in_the_runbook_table() -> None:
    missing = exported() - documented()
    assert not missing, f"metrics without a row in docs/runbook.md: {sorted(missing)}"
