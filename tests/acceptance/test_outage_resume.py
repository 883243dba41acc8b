"""Acceptance: after a PostgreSQL outage of any length, every process resumes work within
about a second of the server answering again (a private server: the shared one is never
touched).

An executor, a worker and an API run against a private server; the test stops it for 2 s,
8 s and 25 s (shorter than the executors' 30 s staleness bound, so the worker is not
recovered: this is about resuming, not recovery) and then measures, from the moment the
server accepts connections again, the time until

- an execution requested then has completed on the worker (the executor scheduled it,
  the worker claimed, ran and recorded it), and
- the API answers a request that needs the database.

Before the fix the pool stopped reconnecting 5 s into an outage and tried again only when
a new request came, while every loop waited out the pool's 30 s timeout: after an outage
longer than ~5 s the worker sat idle up to ~22 s while its heartbeat said it was alive.
"""

from __future__ import annotations

import socket
import time

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from acceptance.helpers import Procs, conveyor_env, describe, eventually
from acceptance.pg import PrivatePostgres
from conveyor.sdk import request_execution

pytestmark = pytest.mark.acceptance

# "Within about a second", with slack for a loaded two-core box.
RESUMED_WITHIN = 2.5
# The default heartbeat: the executors' staleness bound (30 s) is longer than every outage.
HEARTBEAT = 10.0


@pytest.fixture
def env(private_pg: PrivatePostgres) -> dict[str, str]:
    return conveyor_env(private_pg.url, CONVEYOR__WORKER__HEARTBEAT_INTERVAL=str(HEARTBEAT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str, eid: int) -> str | None:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=3) as conn:
        row = conn.execute("SELECT status FROM conveyor.execution WHERE id = %s", (eid,)).fetchone()
    return None if row is None else str(row["status"])


def _request(url: str) -> int:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=3,
                         options="-c search_path=conveyor") as conn:  # fmt: skip
        return request_execution(conn, "core.echo", {"message": "after the outage"})


@pytest.mark.parametrize("outage", [2.0, 8.0, 25.0])
def test_every_process_resumes_within_a_second_of_the_server(
    private_pg: PrivatePostgres, procs: Procs, outage: float
) -> None:
    url = private_pg.url
    token = procs.run("tokens", "create", "--role", "operator")
    assert token.returncode == 0, describe(token)
    port = _free_port()
    executor = procs.start("executor", name="executor")
    worker = procs.start("worker", "--name", "w1", name="worker")
    api = procs.start("api", name="api", env={**procs.env, "CONVEYOR__API__PORT": str(port)})
    for proc, line in ((executor, "executor started"), (worker, "worker registered"), (api, "API listening")):
        proc.wait_for_log(line, timeout=60)

    def logs() -> str:
        return procs.logs() + "\n" + private_pg.logs()

    warm = _request(url)  # every process has used its pool before the outage
    eventually(lambda: _status(url, warm) == "completed", timeout=30, message=logs)

    headers = {"Authorization": f"Bearer {token.stdout.splitlines()[-1]}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as client:
        assert client.get(f"/api/v1/executions/{warm}").status_code == 200
        private_pg.stop("fast")
        down = time.monotonic()
        # Nothing happens meanwhile: no request reaches the pools to wake them.
        while time.monotonic() - down < outage:
            time.sleep(0.1)
        private_pg.start()  # returns once the server accepts connections
        back = time.monotonic()

        eid = _request(url)

        def answered() -> bool:
            return client.get(f"/api/v1/executions/{eid}", timeout=2).status_code == 200

        eventually(answered, timeout=60, interval=0.02, message=logs)
        api_answered = time.monotonic() - back
        eventually(lambda: _status(url, eid) == "completed", timeout=60, interval=0.02, message=logs)
        executed = time.monotonic() - back

    print(f"\noutage {outage:g}s: execution completed {executed:.2f}s, API answered {api_answered:.2f}s "
          "after the server was back")  # fmt: skip
    assert executed <= RESUMED_WITHIN, (executed, logs())
    assert api_answered <= RESUMED_WITHIN, (api_answered, logs())
    for proc in (executor, worker, api):
        assert proc.returncode is None, proc.logs()
        assert "Traceback" not in proc.stderr(), proc.logs()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT status FROM conveyor.worker WHERE name = 'w1'").fetchone()
    assert row == {"status": "active"}, logs()
