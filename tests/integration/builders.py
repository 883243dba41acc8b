"""Builders shared by the integration tests: rows made as the services make them (or
by hand where a test needs a state no service makes), and the small queries tests read
them back with. One definition each; the pool and transport fixtures are in conftest.py."""

from __future__ import annotations

from typing import Any

import psycopg

Conn = psycopg.Connection[dict[str, Any]]


def waiting_on_a_lock(conn: Conn, pid: int) -> bool:
    """Whether the server shows session ``pid`` waiting for a lock."""
    row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"
