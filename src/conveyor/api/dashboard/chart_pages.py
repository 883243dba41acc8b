"""The charts page (``/charts``, live part ``/_live/charts``): throughput, failures and
request-to-start latency per minute over the last hour, and the queue depth by action
now, read with the named queries of ``charts.sql`` (database clock) and drawn as inline
SVG by ``charts.py``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from conveyor.api.dashboard import charts
from conveyor.api.dashboard.charts import Series
from conveyor.api.dashboard.pages import Loader, _view, cached
from conveyor.api.dashboard.web import seconds
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

router = APIRouter()

QUEUE_ACTIONS = 15  # the deepest queues shown; the rest are summed up under the chart
_TTL = 2.0  # read at most this often per API process, however many browsers poll


async def chart_values(conn: AsyncConn) -> dict[str, Any]:
    finished = await (await conn.execute(Q["chart_finished_by_minute"])).fetchall()
    latency = await (await conn.execute(Q["chart_latency_by_minute"])).fetchall()
    queue = await (await conn.execute(Q["chart_queue_depth"], {"limit": QUEUE_ACTIONS + 1})).fetchall()
    times = [r["minute"] for r in finished]
    completed = [r["completed"] for r in finished]
    failed = [r["failed"] for r in finished]
    throughput = charts.time_bars(
        "throughput",
        "Finished per minute",
        f"Executions finished in each minute of the last hour: {sum(completed)} completed, {sum(failed)} failed "
        "(failed, timeout or abandoned).",
        times,
        [Series("completed", "completed", completed), Series("failed", "failed", failed)],
    )
    failures = charts.time_bars(
        "failures",
        "Failures per minute",
        f"Executions that failed, timed out or were abandoned in each minute of the last hour: {sum(failed)}.",
        times,
        [Series("failed", "failed", failed)],
    )
    p50, p95 = [r["p50"] for r in latency], [r["p95"] for r in latency]
    samples = sum(r["samples"] for r in latency)
    lines = charts.time_lines(
        "latency",
        "Request to start",
        f"p50 and p95 of the seconds from request to first start, per minute of the last hour ({samples} starts).",
        [r["minute"] for r in latency],
        [Series("p50", "p50", p50), Series("p95", "p95", p95)],
        fmt=seconds,
    )
    shown, rest = queue[:QUEUE_ACTIONS], queue[QUEUE_ACTIONS:]
    depth = charts.category_bars(
        "queue",
        "Queue depth by action",
        f"Executions waiting now, per action: {sum(r['requested'] for r in shown)} requested, "
        f"{sum(r['scheduled'] for r in shown)} scheduled (the {QUEUE_ACTIONS} deepest queues).",
        [r["action_ref"] for r in shown],
        [
            Series("requested", "requested", [r["requested"] for r in shown]),
            Series("scheduled", "scheduled", [r["scheduled"] for r in shown]),
        ],
    )
    return {
        "throughput": throughput,
        "failures": failures,
        "latency": lines,
        "queue": depth,
        "more_queues": bool(rest),
        "at": finished[-1]["at"] if finished else None,
        "completed": sum(completed),
        "failed": sum(failed),
        "samples": samples,
    }


def _charts_loader(request: Request) -> Loader:
    return cached(request, "dashboard_charts", _TTL, chart_values)


@router.get("/charts")
async def charts_page(request: Request) -> Response:
    return await _view(request, "charts.html", _charts_loader(request))


@router.get("/_live/charts")
async def charts_live(request: Request) -> Response:
    return await _view(request, "charts.html", _charts_loader(request), live=True)
