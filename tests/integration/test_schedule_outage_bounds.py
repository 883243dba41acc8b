"""A 1-second schedule with catch-up 'all' after a long outage (review, issue #13): the
work is bounded -- each pass decides at most MAX_SLOTS_PER_PASS slots of it, only the
slots within catchup_window are requested, every slot gets exactly one row, and the
engine then stops (nothing due, next_fire in the future). Also the cost, for the record:
an outage of N seconds writes N 'missed' rows (see the review report)."""

from __future__ import annotations

import time
from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.domain.schedules import MAX_SLOTS_PER_PASS
from conveyor.executor.schedules import Firer
from integration.builders import Conn, client_of

OUTAGE = 3 * 3600  # seconds, one slot each


async def test_a_long_outage_on_a_one_second_schedule_is_worked_off_in_bounded_passes(
    conn: Conn, pool: AsyncConnectionPool[Any]
) -> None:
    with client_of(conn) as client:
        client.create_schedule("sec", every=1, action="core.noop", catchup="all", catchup_window="10m")
    conn.execute(
        "UPDATE schedule SET created = now() - make_interval(secs => %(s)s), updated = now() - make_interval(secs => "
        "%(s)s), next_fire = now() - make_interval(secs => %(s)s) WHERE name = 'sec'",
        {"s": OUTAGE + 0.5},
    )
    firer = Firer(pool, batch_size=100)
    passes, started = 0, time.monotonic()
    while True:
        result = await firer.run_pass()
        assert result.slots <= MAX_SLOTS_PER_PASS
        passes += 1
        if not result.full and result.slots < MAX_SLOTS_PER_PASS:
            break
        assert passes <= OUTAGE // MAX_SLOTS_PER_PASS + 3, "not converging"
    took = time.monotonic() - started
    rows = conn.execute("SELECT outcome, count(*) AS n FROM schedule_slot GROUP BY outcome").fetchall()
    counts = {r["outcome"]: r["n"] for r in rows}
    total = sum(counts.values())
    assert OUTAGE - 2 <= total <= OUTAGE + took + 2, counts  # the slots of the catching-up time too
    assert 590 <= counts.get("requested", 0) <= 612, counts  # the window's 600 (+ on-time ones)
    distinct = conn.execute("SELECT count(DISTINCT slot) AS n FROM schedule_slot").fetchone()
    assert distinct is not None
    assert distinct["n"] == total
    assert (await firer.run_pass()).slots <= 1  # caught up: at most the slot of this very second
    print(f"\n{OUTAGE} s outage: {passes} passes, {took:.2f} s, {counts}")
