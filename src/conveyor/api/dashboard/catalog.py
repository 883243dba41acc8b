"""What ``/policies`` and ``/actions`` show (issue #15), read with the API's and CLI's own
named queries (``list_policies``, ``list_actions``, ``get_action``, the executor's
``live_workers``) and the bounded ones of ``dashboard_catalog.sql``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.api.dashboard.data import NotFound
from conveyor.api.dashboard.web import pretty
from conveyor.domain.placement import Candidate, Claim
from conveyor.store.db import AsyncConn
from conveyor.store.queries import Q

QUEUE_SHOWN = 50  # waiting executions shown per group; the rest are counted
GROUPS_SHOWN = 100  # groups with someone waiting, over all policies
SLOTS_SHOWN = 500  # slot holders, over all policies
RECENT = 20  # an action's newest executions on its page


def group_label(key: Any) -> str:
    """A group key (the grouping parameters' values) as the CLI's ``describe_admission`` shows it."""
    return json.dumps(key, ensure_ascii=False) if key else ""


async def policies(conn: AsyncConn) -> dict[str, Any]:
    rows = list(await (await conn.execute(Q["list_policies"])).fetchall())
    slots = await (await conn.execute(Q["dash_policy_slots"], {"limit": SLOTS_SHOWN})).fetchall()
    queue = await conn.execute(Q["dash_policy_queue"], {"groups": GROUPS_SHOWN, "per_group": QUEUE_SHOWN})
    held: dict[str, list[dict[str, Any]]] = {}
    for s in slots:
        held.setdefault(s["policy"], []).append({**s, "group": group_label(s["group_key"])})
    # policy -> group label -> {"waiting": whole count, "rows": the first QUEUE_SHOWN}
    waiting: dict[str, dict[str, dict[str, Any]]] = {}
    for q in await queue.fetchall():
        group = waiting.setdefault(q["policy"], {}).setdefault(
            group_label(q["group_key"]), {"waiting": q["waiting"], "rows": []}
        )
        group["rows"].append(q)
    return {
        "policies": rows,
        "held": held,
        "queues": waiting,
        "queue_shown": QUEUE_SHOWN,
        "slots_shown": SLOTS_SHOWN,
        "slots_cut": len(slots) == SLOTS_SHOWN,
    }


def offering(action: Mapping[str, Any], live: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The live workers the scheduler could give ``action`` to: the placement's own test
    (``Candidate.can_run``), so that the page and the scheduler cannot disagree."""
    claim = Claim(0, action["ref"], action["runner_type"], action["runtime"], 0.0)
    return [w for w in live if Candidate(w["id"], w["runtimes"], w["actions"], w["capacity"], w["load"]).can_run(claim)]


async def actions(conn: AsyncConn) -> dict[str, Any]:
    rows = list(await (await conn.execute(Q["list_actions"])).fetchall())
    live = list(await (await conn.execute(Q["live_workers"])).fetchall())
    hour: dict[str, dict[str, int]] = {}
    for c in await (await conn.execute(Q["dash_action_counts"])).fetchall():
        hour.setdefault(c["ref"], {})[c["status"]] = c["n"]
    listed = [{**a, "workers": [w["name"] for w in offering(a, live)], "hour": hour.get(a["ref"], {})} for a in rows]
    return {"actions": listed}


async def action(conn: AsyncConn, ref: str) -> dict[str, Any]:
    row = await (await conn.execute(Q["get_action"], {"ref": ref})).fetchone()
    if row is None:
        raise NotFound(f"no action {ref}")
    live = list(await (await conn.execute(Q["live_workers"])).fetchall())
    hour = {c["status"]: c["n"] for c in await (await conn.execute(Q["dash_action_hour"], {"ref": ref})).fetchall()}
    recent = await (await conn.execute(Q["dash_action_recent"], {"ref": ref, "limit": RECENT})).fetchall()
    return {
        "action": row,
        "schema_text": pretty(row["parameters_schema"]),
        "metadata_text": pretty(row["metadata"]),
        "workers": offering(row, live),
        "hour": hour,
        "recent": recent,
        "recent_limit": RECENT,
    }
