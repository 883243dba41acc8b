"""Shared by the fault acceptance modules (test_faults.py, test_partition.py): the
settings of a fleet under faults, and reading a database that may be briefly away
(each read on its own short-lived connection)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row

from acceptance.helpers import Procs

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SCHEMA = "conveyor"
TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}
# Heartbeat 1 s (FAST_SETTINGS), so the staleness threshold is 3 s; quick sweeps; an
# executor's claim left in doubt by an outage is handed back after 5 s, not 30.
FAULT_SETTINGS = {
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    "CONVEYOR__EXECUTOR__NO_WORKER_GRACE": "30",
    "CONVEYOR__EXECUTOR__CLAIM_TIMEOUT": "5",
}
HEARTBEAT, STALENESS = 1.0, 3.0


def _connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(
        url, autocommit=True, row_factory=dict_row, connect_timeout=3, options=f"-c search_path={SCHEMA},public"
    )


def _rows(url: str, query: str, params: Mapping[str, Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with _connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _one(url: str, query: str, params: Mapping[str, Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
    rows = _rows(url, query, params)
    assert len(rows) == 1, rows
    return rows[0]


def _alive(procs: Procs) -> bool:
    return all(p.returncode is None for p in procs.started)
