"""The Workers page (issue #15): each worker's state -- for an inactive one, why and since
when (``worker.inactive_reason``, migration 0030) --, what it runs now (bounded: the first
``RUNS_SHOWN`` of its in-flight executions, with the whole count), what it offers (its
Python actions and runtimes), load, heartbeat age and cordon; live workers first."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from conveyor.api.dashboard import data
from conveyor.domain.status import InactiveReason, WorkerStatus
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

RUNS_SHOWN = 20

# What each reason means, for the page (its title text); the words match the runbook's.
REASONS: dict[str, str] = {
    InactiveReason.STOPPED: "stopped gracefully (SIGTERM or SIGINT: drained, then exited)",
    InactiveReason.PROCESS_GONE: "process died (killed, crashed): liveness lock gone, no session of it left",
    InactiveReason.LOCK_LOST: "liveness lock gone longer than its lock_grace (its liveness session was dropped)",
    InactiveReason.HEARTBEAT_STALE: "heartbeat older than its stale_after, or never sent (partition, hang)",
}


async def workers(conn: AsyncConn) -> dict[str, Any]:
    fleet = await data.workers(conn)
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for run in await (await conn.execute(Q["dash_worker_runs"], {"limit": RUNS_SHOWN})).fetchall():
        runs[run["worker"]].append(run)
    offers = {row["id"]: row["actions"] for row in await (await conn.execute(Q["dash_worker_offers"])).fetchall()}
    shown = [
        {**w, "runs": runs.get(w["id"], []), "actions": offers.get(w["id"], [])}
        for w in fleet  # a worker registered between the reads offers nothing yet
    ]
    # Live ones first (active, then draining), the inactive after them; by name within.
    order = {WorkerStatus.ACTIVE: 0, WorkerStatus.DRAINING: 1, WorkerStatus.INACTIVE: 2}
    shown.sort(key=lambda w: (order.get(w["status"], 3), w["name"]))
    return {"workers": shown, "reasons": REASONS, "runs_shown": RUNS_SHOWN}
