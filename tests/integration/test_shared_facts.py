"""Facts the code states once, on both sides of the database (issue #26): the Python
definition and the SQL one are compared here, so neither can change alone."""

from __future__ import annotations

from conveyor.domain.status import TERMINAL, TERMINAL_ORDER
from integration.builders import Conn


def test_the_terminal_statuses_are_the_same_in_sql(conn: Conn) -> None:
    row = conn.execute("SELECT terminal_statuses() AS statuses").fetchone()
    assert row is not None
    assert row["statuses"] == [s.value for s in TERMINAL_ORDER]
    assert set(row["statuses"]) == TERMINAL


def test_terminal_statuses_fold_to_a_constant(conn: Conn) -> None:
    # Inlined and folded at plan time: the (status, updated) index sees the literal array.
    plan = conn.execute("EXPLAIN SELECT id FROM execution WHERE status = ANY(terminal_statuses())").fetchall()
    text = "\n".join(str(next(iter(r.values()))) for r in plan)
    assert "terminal_statuses" not in text
    assert "{completed,failed,timeout,cancelled,abandoned}" in text
