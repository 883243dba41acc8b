"""Shared by the RabbitMQ fault acceptance modules (test_rabbitmq_faults.py,
test_rabbitmq_messages.py): the settings of a fleet on the RabbitMQ transport, starting
its processes, and what the database and the broker show."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import psycopg

from acceptance import mq
from acceptance.helpers import Proc, Procs, describe, eventually
from support.polling import GiveUp

Conn = psycopg.Connection[dict[str, Any]]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

TERMINAL = {"completed", "failed", "timeout", "cancelled", "abandoned"}
MQ_SETTINGS = {
    "CONVEYOR__TRANSPORT": "rabbitmq",
    "CONVEYOR__RECOVERY__SWEEP_INTERVAL": "0.2",
    # Reconciler every 2 s: a message lost with a connection costs little.
    "CONVEYOR__MESSAGE_QUEUE__RECONCILE_AFTER": "4",
}
CONNECTED = "connected to RabbitMQ"
LOST = "RabbitMQ connection lost; reconnecting"


# -- helpers ------------------------------------------------------------------------------


def start_executor(procs: Procs, env: dict[str, str], label: str = "executor", **overrides: object) -> Proc:
    proc = procs.start("executor", name=label, env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("executor started")
    proc.wait_for_log(CONNECTED)
    return proc


def start_worker(
    procs: Procs, env: dict[str, str], name: str | None, label: str | None = None, **overrides: object
) -> Proc:
    """A worker named ``name`` (None: by CONVEYOR__WORKER__NAME in the environment)."""
    args = ("worker", "--name", name) if name else ("worker",)
    proc = procs.start(*args, name=label or f"worker-{name}", env={**env, **{k: str(v) for k, v in overrides.items()}})
    proc.wait_for_log("worker registered")
    proc.wait_for_log(CONNECTED)
    return proc


def worker_id(db: Conn, name: str) -> int:
    row = db.execute("SELECT id FROM worker WHERE name = %s", (name,)).fetchone()
    assert row is not None, name
    return int(row["id"])


def outbox_depth(db: Conn) -> int:
    row = db.execute("SELECT count(*) AS n FROM outbox").fetchone()
    assert row is not None
    return int(row["n"])


def statuses(db: Conn, ids: list[int]) -> dict[str, int]:
    rows = db.execute(
        "SELECT status, count(*) AS n FROM execution WHERE id = ANY(%s) GROUP BY status ORDER BY status", (ids,)
    ).fetchall()
    return {r["status"]: int(r["n"]) for r in rows}


def all_terminal(db: Conn, ids: list[int]) -> Callable[[], bool]:
    return lambda: sum(n for s, n in statuses(db, ids).items() if s in TERMINAL) == len(ids)


def assert_completed_exactly_once(db: Conn, ids: list[int]) -> None:
    """Every execution completed, with exactly one attempt, which completed."""
    rows = db.execute(
        """
        SELECT e.id, e.status, e.attempt, count(a.attempt) AS attempts,
               count(a.attempt) FILTER (WHERE a.outcome = 'completed') AS completed,
               array_remove(array_agg(a.outcome ORDER BY a.attempt), NULL) AS outcomes
        FROM execution e LEFT JOIN execution_attempt a ON a.execution = e.id
        WHERE e.id = ANY(%s) GROUP BY e.id ORDER BY e.id
        """,
        (ids,),
    ).fetchall()
    assert len(rows) == len(ids)
    wrong = [
        dict(r) for r in rows if (r["status"], r["attempt"], r["attempts"], r["completed"]) != ("completed", 1, 1, 1)
    ]
    assert not wrong, f"{len(wrong)} executions not completed exactly once, e.g. {wrong[:5]}"


def dead_letters(db: Conn) -> list[dict[str, Any]]:
    return [dict(r) for r in db.execute("SELECT * FROM dead_letter ORDER BY id").fetchall()]


def assert_no_work_dead_lettered(db: Conn) -> None:
    """No dead letter moved or failed an execution (nothing expired or looped in a worker
    queue), and none is left pending."""
    moved = [d for d in dead_letters(db) if d["resolution"] in ("rescheduled", "failed") or d["resolution"] is None]
    assert not moved, moved


def log_count(proc: Proc, text: str) -> int:
    return (proc.stderr() + proc.stdout()).count(text)


def wait_log_count(proc: Proc, text: str, more_than: int, timeout: float = 30.0) -> None:
    """Until ``text`` was logged more than ``more_than`` times; fail at once if the process exits."""

    def logged_again() -> bool:
        if log_count(proc, text) > more_than:
            return True
        if proc.returncode is not None:
            raise GiveUp(f"{proc.name} exited before logging {text!r} again\n{proc.logs()}")
        return False

    eventually(
        logged_again,
        timeout,
        0.05,
        lambda: f"{proc.name} did not log {text!r} again within {timeout:g}s\n{proc.logs()}",
    )


def consumed(prefix: str, *names: str) -> Callable[[], dict[str, dict[str, int]] | None]:
    """The queues, once each named one exists and has a consumer."""

    def check() -> dict[str, dict[str, int]] | None:
        found = mq.live_queues(prefix)
        return found if all(n in found and found[n]["consumers"] >= 1 for n in names) else None

    return check


def queues_empty(prefix: str) -> Callable[[], dict[str, int] | None]:
    """The depths, once every ``prefix.*`` queue holds nothing, acknowledged or not."""

    def check() -> dict[str, int] | None:
        found = mq.depths(prefix)
        return found if found and not any(found.values()) else None

    return check


def echo_completes(procs: Procs, message: str, timeout: float = 30) -> dict[str, Any]:
    done = procs.run("run", "core.echo", f"message={message}", "--wait", "--json", timeout=timeout)
    assert done.returncode == 0, describe(done) + "\n" + procs.logs()
    result = json.loads(done.stdout)
    assert result["status"] == "completed", result
    return dict(result)
