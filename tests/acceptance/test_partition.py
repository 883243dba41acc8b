"""Acceptance: a partition, against real processes. A worker in its own network namespace
loses its link to PostgreSQL while it runs work; that work is recovered after about the
staleness threshold and runs on another worker, the cut-off worker stops its copy before
the new one starts, its late result is refused, and it rejoins when the link is back.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.faults_kit import (
    FAULT_SETTINGS,
    HEARTBEAT,
    IN_CI,
    SCHEMA,
    STALENESS,
    TERMINAL,
    _alive,
    _connect,
    _one,
    _rows,
)
from acceptance.helpers import Proc, Procs, conveyor_env, eventually
from acceptance.netns import Forwarder, VethNamespace, liveness_keepalive, netns_problem
from acceptance.pg import PrivatePostgres
from conveyor.sdk import Client, request_execution

pytestmark = pytest.mark.acceptance


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    group = Procs(tmp_path / "logs", {})
    try:
        yield group
    finally:
        group.close()


# -- 2. a partition ---------------------------------------------------------------------------


@pytest.fixture
def veth() -> Iterator[VethNamespace]:
    problem = netns_problem()
    if problem:
        if IN_CI:
            pytest.fail(f"{problem} (CI=true: the partition test must run)")
        pytest.skip(problem)
    with VethNamespace() as ns:
        yield ns


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z) \[[a-z ]+\] (.*)$")


def _ticks(path: Path) -> tuple[float, float]:
    """First and last timestamp a copy of the ticker wrote."""
    stamps = [float(line) for line in path.read_text().split("\n")[:-1]]  # complete lines only
    return (stamps[0], stamps[-1]) if stamps else (math.inf, math.inf)


def _log_times(proc: Proc, text: str, execution_id: int) -> list[datetime]:
    """When ``proc`` logged ``text`` about ``execution_id`` (its log's own UTC timestamps)."""
    found = []
    for line in proc.stderr().splitlines():
        m = _LOG_LINE.match(line)
        if m and text in m.group(2) and re.search(rf"\bexecution_id={execution_id}\b", m.group(2)):
            found.append(datetime.fromisoformat(m.group(1).replace("Z", "+00:00")))
    return found


def test_partitioned_worker_is_fenced_and_replaced(
    veth: VethNamespace, private_pg: PrivatePostgres, procs: Procs, tmp_path: Path
) -> None:
    # A private server: the shared one may see other suites terminate sessions, which
    # would mix a dropped session into what must be a partition.
    db_url = private_pg.url
    env = conveyor_env(db_url, **FAULT_SETTINGS)
    forwarder = Forwarder(veth.host_addr, ("127.0.0.1", private_pg.port), liveness_keepalive(HEARTBEAT)).start()
    try:
        _partition_scenario(veth, forwarder, db_url, env, procs, tmp_path)
    except BaseException:
        print("=== forwarder: connections ended\n" + "\n".join(forwarder.events))
        raise
    finally:
        procs.close()  # before the forwarder and the namespace go
        procs.started.clear()
        forwarder.close()


def _partition_scenario(
    veth: VethNamespace, forwarder: Forwarder, db_url: str, env: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    ns_url = psycopg.conninfo.make_conninfo(db_url, host=forwarder.host, port=str(forwarder.port))
    short_s, long_s, ticker_s = 5.0, 12.0, 10
    # A subprocess action that appends a timestamp to a file of its own (per shell pid)
    # every 50 ms for ticker_s seconds: shows when each copy really ran.
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    ticker = (
        f"end=$(( $(date +%s) + {ticker_s} )); "
        f'while [ "$(date +%s)" -lt "$end" ]; do date +%s.%N >> {ticks}/$$; sleep 0.05; done'
    )

    def logs() -> str:  # printed at teardown as well, with the forwarder's events
        return procs.logs()

    executor = procs.start("executor", name="executor", env=env)
    cut_off = Proc(["worker", "--name", "w-ns"], {**env, "DATABASE_URL": ns_url}, tmp_path / "logs", "w-ns",
                   prefix=veth.command())  # fmt: skip
    procs.started.append(cut_off)
    other = procs.start("worker", "--name", "w-root", name="w-root", env=env)
    executor.wait_for_log("executor started")
    cut_off.wait_for_log("worker registered")
    other.wait_for_log("worker registered")

    # The other worker is cordoned until every execution runs on the cut-off one.
    with Client(db_url, SCHEMA) as client:
        client.cordon("w-root")
    with _connect(db_url) as conn:
        long_id = request_execution(conn, "core.sleep", {"seconds": long_s}, schema=SCHEMA)
        short_id = request_execution(conn, "core.sleep", {"seconds": short_s}, schema=SCHEMA)
        ticker_id = request_execution(conn, "core.local", {"cmd": ticker}, schema=SCHEMA)
    ids = (long_id, short_id, ticker_id)

    def running_on_ns() -> list[dict[str, Any]] | None:
        rows = _rows(
            db_url,
            "SELECT e.id, e.status, e.started, w.name FROM execution e LEFT JOIN worker w ON w.id = e.worker "
            "WHERE e.id = ANY(%s)",
            (list(ids),),
        )
        return rows if all(r["status"] == "running" and r["name"] == "w-ns" for r in rows) else None

    started = {r["id"]: r["started"] for r in eventually(running_on_ns, timeout=20, interval=0.1, message=logs)}

    with Client(db_url, SCHEMA) as client:
        client.cordon("w-root", cordoned=False)

    # Cut so that the short execution ends just after the cut (its result is then late)
    # and the long one is still running when the worker fences itself.
    cut_at = started[short_id].timestamp() + short_s - 0.5
    wait = _one(db_url, "SELECT %s - extract(epoch FROM clock_timestamp())::float8 AS s", (cut_at,))["s"]
    assert wait > 0.2, f"too slow to cut in time ({wait:.2f}s left)"
    time.sleep(wait)
    veth.cut()
    cut = _one(db_url, "SELECT clock_timestamp() AS t")["t"]
    print(f"executions started at {started}, link cut at {cut.isoformat()} (database clock)")

    def recovered() -> dict[int, dict[str, Any]] | None:
        rows = _rows(
            db_url,
            "SELECT execution, attempt, worker_name, started FROM execution_attempt "
            "WHERE execution = ANY(%s) AND attempt = 2 AND started IS NOT NULL",
            (list(ids),),
        )
        return {r["execution"]: r for r in rows} if len(rows) == len(ids) else None

    second = eventually(recovered, timeout=STALENESS + 10, interval=0.05, message=logs)
    seen_at = _one(db_url, "SELECT clock_timestamp() AS t")["t"]
    ns_status = _one(db_url, "SELECT status FROM worker WHERE name = 'w-ns'")["status"]
    veth.restore()

    # Recovered after about the threshold (3 s after the last heartbeat, which was at
    # most one interval before the cut), never before the worker could fence itself.
    for eid, row in second.items():
        assert row["worker_name"] == "w-root", row
        delay = (row["started"] - cut).total_seconds()
        assert STALENESS - HEARTBEAT - 0.5 <= delay <= STALENESS + 3.0, (
            f"execution {eid} recovered {delay:.2f}s after the cut"
        )
    assert ns_status == "inactive", f"{ns_status} at {seen_at}"

    # The cut-off worker stopped its copies of the long ones before the new copies started.
    cut_off.wait_for_log("stopped executions", timeout=10)
    for eid in (long_id, ticker_id):
        stopped = _log_times(cut_off, "execution stopped on this worker", eid)
        assert len(stopped) == 1, f"execution {eid}: {stopped}"
        assert stopped[0] < second[eid]["started"], f"execution {eid}: stopped {stopped[0]}, restarted {second[eid]}"
    assert _log_times(cut_off, "execution stopped on this worker", short_id) == []

    # The ticker's first copy (its process group killed) never ran beside the second.
    def two_copies() -> list[tuple[float, float]] | None:
        copies = sorted(_ticks(f) for f in ticks.iterdir())
        return copies if len(copies) == 2 and all(math.isfinite(c[0]) for c in copies) else None

    first, again = eventually(two_copies, timeout=10, interval=0.1, message=logs)
    assert first[1] < again[0], f"the two copies of the subprocess overlapped: {first}, {again}"
    assert first[1] < second[ticker_id]["started"].timestamp(), f"old copy still ticking: {first}, {second}"

    # Link back: the short one's late result is refused, and the worker rejoins.
    eventually(lambda: _log_times(cut_off, "late result refused", short_id), timeout=30, interval=0.2, message=logs)
    cut_off.wait_for_log("worker rejoined", timeout=30)

    def rejoined() -> bool:
        row = _one(db_url, "SELECT status, now() - last_heartbeat < interval '3 seconds' AS fresh FROM worker "
                           "WHERE name = 'w-ns'")  # fmt: skip
        return row["status"] == "active" and row["fresh"]

    eventually(rejoined, timeout=20, interval=0.2, message=logs)

    # All finish on the other worker: exactly one winning attempt each.
    def finished() -> bool:
        rows = _rows(db_url, "SELECT status FROM execution WHERE id = ANY(%s)", (list(ids),))
        return all(r["status"] in TERMINAL for r in rows)

    eventually(finished, timeout=long_s + 15, interval=0.2, message=logs)
    assert len(list(ticks.iterdir())) == 2, "the subprocess ran more than twice"
    for eid in ids:
        execution = _one(db_url, "SELECT e.status, w.name FROM execution e JOIN worker w ON w.id = e.worker "
                                 "WHERE e.id = %s", (eid,))  # fmt: skip
        assert (execution["status"], execution["name"]) == ("completed", "w-root"), (eid, execution)
        attempts = _rows(
            db_url, "SELECT attempt, worker_name, outcome FROM execution_attempt WHERE execution = %s ORDER BY attempt",
            (eid,),
        )  # fmt: skip
        assert [(a["attempt"], a["worker_name"], a["outcome"]) for a in attempts] == [
            (1, "w-ns", "worker_lost"),
            (2, "w-root", "completed"),
        ], (eid, attempts, logs())

    assert _alive(procs), logs()
    assert _one(db_url, "SELECT status FROM worker WHERE name = 'w-ns'")["status"] == "active"
    for p in procs.started:
        assert "Traceback" not in p.stderr(), p.logs()
