"""The log lines the seeds' troubleshooting looks for, written by the real recovery
loops against the real database: the heartbeat monitor's summary ("Deactivated N
worker(s) with stale heartbeats"), the timeout monitor's "Execution {id} has been
scheduled for too long, marking as failed", the dead-letter handler's "Received dead
letter for execution {id}", and the monitors' startup lines (what `grep "heartbeat
monitor started" executor.log` finds)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from structlog.testing import capture_logs

from conveyor.config import Settings
from conveyor.executor import dead_letters, recovery, service
from conveyor.executor.dead_letters import DeadLetterHandler
from conveyor.executor.recovery import Recovery
from conveyor.executor.scheduler import Scheduler
from conveyor.executor.service import ExecutorService
from conveyor.transport import messages as m
from conveyor.transport.postgres import PostgresTransport
from integration.builders import add_worker
from support.polling import until

Conn = psycopg.Connection[dict[str, Any]]
Pool = AsyncConnectionPool[Any]


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every event the executor modules log during the test."""
    with capture_logs() as events:
        # Module loggers may have cached another configuration: fresh ones see the capture.
        for module in (recovery, dead_letters, service):
            monkeypatch.setattr(module, "log", structlog.get_logger(module.__name__))
        yield events


def lines(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["event"]) for e in events]


async def test_the_sweep_counts_workers_with_stale_heartbeats(
    conn: Conn, pool: Pool, transport: PostgresTransport, logged: list[dict[str, Any]]
) -> None:
    for n in range(2):
        add_worker(conn, f"w-stale-{n}", heartbeat="now() - interval '1 hour'")
    add_worker(conn, "w-gone", heartbeat="now()", lock_epoch="pg_postmaster_start_time()")
    add_worker(conn, "w-fresh", heartbeat="now()")
    assert (await Recovery(pool, Settings()).sweep())["dead"] == 3
    assert "Deactivated 2 worker(s) with stale heartbeats" in lines(logged)
    assert "Deactivated 1 worker(s) whose process is gone" in lines(logged)
    assert any(line.startswith("Worker w-stale-0 (ID: ") and "heartbeat is stale" in line for line in lines(logged))


async def check_until(rec: Recovery) -> dict[str, int]:
    """The monitor's check, until the (short, real) timeout has passed."""
    result: dict[str, int] = await until(
        rec.check_scheduled_timeouts, timeout=10, what="the scheduled timeout passed", interval=0.05
    )
    return result


async def test_the_timeout_monitor_says_scheduled_for_too_long(
    conn: Conn, pool: Pool, transport: PostgresTransport, logged: list[dict[str, Any]]
) -> None:
    add_worker(conn, "w-silent", heartbeat="now()")  # alive, but never starts what it is given
    row = conn.execute("SELECT request_execution('core.noop', %s) AS id", (Jsonb({}),)).fetchone()
    assert row is not None
    eid = row["id"]
    scheduler = Scheduler(pool, executor_id="ex-test", batch_size=10, no_worker_grace=0,
                          unplaceable_check_interval=0)  # fmt: skip

    def monitor(reschedules: int) -> Recovery:
        cfg = {"scheduled_timeout": 0.2, "scheduled_timeout_reschedules": reschedules}
        return Recovery(pool, Settings(executor=cfg))  # type: ignore[arg-type]

    assert (await scheduler.run_round()).dispatched == 1
    assert await check_until(monitor(1)) == {"rescheduled": 1, "failed": 0}
    assert f"Execution {eid} has been scheduled for too long, moving it to another worker" in lines(logged)

    assert (await scheduler.run_round()).dispatched == 1
    assert await check_until(monitor(1)) == {"rescheduled": 0, "failed": 1}
    assert f"Execution {eid} has been scheduled for too long, marking as failed" in lines(logged)


async def test_the_dead_letter_handler_says_what_it_received(
    pool: Pool, transport: PostgresTransport, logged: list[dict[str, Any]]
) -> None:
    handler = DeadLetterHandler(pool, transport, Settings(), "test")
    payload = {"execution_id": 41, "attempt": 1, "worker_id": 3, "scheduled": "2026-01-01T00:00:00+00:00"}
    body = m.encode("m1", m.SCHEDULED, payload, datetime.now(UTC))
    letter = m.DeadLetter(dedupe_key="k1", message_id="m1", transport="rabbitmq", queue="conveyor.worker.3.executions",
                          routing_key="execution.scheduled.worker.3", reason="expired", body=body)  # fmt: skip
    await handler.handle(letter)
    assert "Received dead letter for execution 41" in lines(logged)


DISABLED = "Dead letter handler disabled (dead_letter.enabled: false): dead letters are not consumed"


@pytest.mark.parametrize(
    ("dead_letter", "kind", "expected"),
    [
        ({}, "postgres", "Dead letter handler enabled (dispatches older than 300s expire; checked every 5s)"),
        ({}, "rabbitmq", "Dead letter handler enabled (exchange: conveyor.dlx, queue: conveyor.dlx.queue)"),
        ({"enabled": False}, "postgres", DISABLED),
    ],
)  # fmt: skip
async def test_the_executor_logs_its_monitors_at_startup(
    pool: Pool, transport: PostgresTransport, db_url: str, logged: list[dict[str, Any]],
    dead_letter: dict[str, Any], kind: str, expected: str,
) -> None:  # fmt: skip
    settings = Settings(worker={"heartbeat_interval": 10}, recovery={"sweep_interval": 60}, dead_letter=dead_letter)  # type: ignore[arg-type]
    executor = ExecutorService(settings, db_url, pool, transport)
    executor._transport_kind = kind  # what startup reports; the transport itself is not started here
    executor._log_monitors()
    assert lines(logged)[:3] == [
        "Starting worker heartbeat monitor...",
        "Worker heartbeat monitor started (check interval: 60s, staleness threshold: 30s)",
        "Execution timeout monitor started (check interval: 60s, scheduled timeout: 300s)",
    ]
    assert lines(logged)[3] == expected
