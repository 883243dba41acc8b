"""Acceptance: the REST API as its users meet it: tokens from the command line, ``conveyor
api`` processes (two at once, on the ports they are given) beside a real executor and worker,
the seeds' ``curl`` example verbatim, the event stream over a real socket, cancelling a
running execution, and ``conveyor up`` printing the URL and an admin token on first start."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, describe, eventually, processes_with_argv

pytestmark = pytest.mark.acceptance

TOKEN_LINE = re.compile(r"cvy_[A-Za-z0-9_-]{43}")
SEEDS_BODY = '{"action_ref": "core.echo", "parameters": {"message": "test"}}'
Db = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_api(procs: Procs, name: str) -> str:
    """``conveyor api`` on a free port given through CONVEYOR__API__PORT; its base URL."""
    port = free_port()
    api = procs.start("api", name=name, env={**procs.env, "CONVEYOR__API__PORT": str(port)})
    api.wait_for_log("API listening", timeout=30)
    assert f"url=http://127.0.0.1:{port}" in api.stderr() + api.stdout(), api.logs()
    return f"http://127.0.0.1:{port}"


def create_token(procs: Procs, role: str, *extra: str) -> str:
    result = procs.run("tokens", "create", "--role", role, *extra)
    assert result.returncode == 0, describe(result)
    token = result.stdout.splitlines()[-1]
    assert TOKEN_LINE.fullmatch(token), describe(result)
    return token


def many(procs: Procs, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Independent commands at once (each is its own process), in order; all but usage
    errors must succeed."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        results = list(pool.map(lambda args: procs.run(*args), commands))
    return results


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def execution(client: httpx.Client, eid: int) -> dict[str, Any]:
    response = client.get(f"/api/v1/executions/{eid}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def status_becomes(client: httpx.Client, eid: int, wanted: str, timeout: float = 20) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        e = execution(client, eid)
        return e if e["status"] == wanted else None

    return eventually(check, timeout, interval=0.1, message=lambda: json.dumps(execution(client, eid)))


class StreamReader(threading.Thread):
    """Reads the event stream of a real server in the background."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.events: list[dict[str, Any]] = []
        self.opened = threading.Event()
        self.content_type = ""
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.url, timeout=httpx.Timeout(5, read=None)) as client,
                client.stream("GET", "/api/v1/executions/stream", headers=bearer(self.token)) as response,
            ):
                self.content_type = response.headers["content-type"]
                for line in response.iter_lines():
                    if line.startswith(":"):
                        self.opened.set()
                    if line.startswith("data: "):
                        self.events.append(json.loads(line[len("data: ") :]))
                    if self.stop.is_set():
                        return
        except httpx.TransportError:  # the server was stopped at the end of the test
            return

    def statuses(self, eid: int) -> list[str]:
        return [e["status"] for e in list(self.events) if e["id"] == eid]


# -- tokens on the command line -----------------------------------------------------------------


def test_tokens_create_list_revoke(procs: Procs, db: Db) -> None:
    result = procs.run("tokens", "create", "--role", "operator", "--name", "ci deploys")
    assert result.returncode == 0, describe(result)
    token = result.stdout.splitlines()[-1]
    assert TOKEN_LINE.fullmatch(token), describe(result)  # alone on the last line of stdout
    assert "shown only now" in result.stderr

    listed, table = many(procs, ("tokens", "list", "--json"), ("tokens", "list"))
    [entry] = [t for t in json.loads(listed.stdout) if t["name"] == "ci deploys"]
    assert entry["role"] == "operator"
    assert entry["prefix"] == token[:10]
    assert entry["revoked"] is None
    assert token not in listed.stdout
    assert "ci deploys" in table.stdout
    assert token not in table.stdout
    stored = db.execute("SELECT token_hash FROM api_token WHERE id = %s", (entry["id"],)).fetchone()
    assert stored is not None
    assert bytes(stored["token_hash"]) == hashlib.sha256(token.encode()).digest()  # hashed, never the token

    revoked = procs.run("tokens", "revoke", str(entry["id"]))
    assert revoked.returncode == 0, describe(revoked)
    assert f"token {entry['id']} revoked" in revoked.stdout
    listed, again, huge, bad = many(
        procs,
        ("tokens", "list", "--json"),
        ("tokens", "revoke", str(entry["id"])),
        ("tokens", "revoke", str(10**30)),
        ("tokens", "create", "--role", "root"),
    )
    [entry] = [t for t in json.loads(listed.stdout) if t["id"] == entry["id"]]
    assert entry["revoked"] is not None
    for refused, missing in ((again, entry["id"]), (huge, 10**30)):
        assert refused.returncode == 1, describe(refused)
        assert f"no live token with id {missing}" in refused.stderr, describe(refused)
    assert bad.returncode == 2, describe(bad)  # a usage error
    assert "'root' is not one of" in bad.stderr, describe(bad)
    assert "Traceback" not in again.stderr + huge.stderr + bad.stderr


# -- conveyor api -----------------------------------------------------------------------------------


def test_api_processes_serve_the_seeds_curl_example_stream_and_cancel(procs: Procs) -> None:
    procs.start("executor", name="executor")
    procs.start("worker", "--name", "w-api", name="worker").wait_for_log("worker registered", timeout=30)
    first, second = start_api(procs, "api-1"), start_api(procs, "api-2")
    token = create_token(procs, "operator")
    viewer = create_token(procs, "viewer")

    with httpx.Client(base_url=first) as one, httpx.Client(base_url=second, headers=bearer(viewer)) as two:
        for url in (first, second):  # any number of API processes: both serve
            assert httpx.get(f"{url}/health/ready").json()["status"] == "ready"
            assert httpx.get(f"{url}/api/v1/executions").status_code == 401
            assert httpx.get(f"{url}/metrics").text.startswith("# HELP")
        stream = StreamReader(second, viewer)
        stream.start()
        assert stream.opened.wait(10), "the event stream did not open"
        assert stream.content_type.startswith("text/event-stream")

        # The seeds' example, verbatim (plus -s and -w to read the status): curl -d sends it
        # as application/x-www-form-urlencoded.
        curl = subprocess.run(
            f"""curl -s -w '\\n%{{http_code}}' -X POST {first}/api/v1/executions \\
                 -H "Authorization: Bearer $TOKEN" \\
                 -d '{SEEDS_BODY}'""",
            shell=True, env={"TOKEN": token, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        body, _, code = curl.stdout.rpartition("\n")
        assert code == "201", (curl.stdout, curl.stderr)
        created = json.loads(body)
        assert (created["action_ref"], created["parameters"]) == ("core.echo", {"message": "test"})

        done = status_becomes(two, created["id"], "completed")  # read through the other process
        assert done["result"]["data"] == "test"
        assert [(a["worker_name"], a["outcome"]) for a in done["attempts"]] == [("w-api", "completed")]
        # Changes between two polls of the stream (every api.stream_interval) come as one event.
        eventually(lambda: stream.statuses(created["id"])[-1:] == ["completed"], 10, message=lambda: str(stream.events))

        # Cancelling a running execution: canceling, then cancelled once the worker stopped it.
        one.headers.update(bearer(token))
        sleeping = one.post("/api/v1/executions", json={"action_ref": "core.sleep", "parameters": {"seconds": 60}})
        assert sleeping.status_code == 201, sleeping.text
        eid = sleeping.json()["id"]
        status_becomes(one, eid, "running")
        started = time.monotonic()
        cancel = one.post(f"/api/v1/executions/{eid}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["status"] in ("canceling", "cancelled")
        cancelled = status_becomes(one, eid, "cancelled", timeout=10)
        assert time.monotonic() - started < 10
        assert cancelled["attempts"][-1]["outcome"] == "cancelled"
        assert one.post(f"/api/v1/executions/{eid}/cancel").status_code == 409
        eventually(lambda: stream.statuses(eid)[-1:] == ["cancelled"], 10, message=lambda: str(stream.events))

        # A command: its process group is killed.
        local = one.post("/api/v1/executions", json={"action_ref": "core.local", "parameters": {"cmd": "sleep 41.5"}})
        eid = local.json()["id"]
        status_becomes(one, eid, "running")
        eventually(lambda: processes_with_argv(["sleep", "41.5"]), 10)
        assert one.post(f"/api/v1/executions/{eid}/cancel").json()["status"] == "canceling"
        assert status_becomes(one, eid, "cancelled", timeout=10)["attempts"][-1]["outcome"] == "cancelled"
        eventually(lambda: not processes_with_argv(["sleep", "41.5"]), 10)

        refused = two.post("/api/v1/executions", json={"action_ref": "core.noop"})
        assert refused.status_code == 403
        assert "operator" in refused.json()["error"]
        stream.stop.set()


# -- conveyor up --------------------------------------------------------------------------------


def test_up_prints_the_url_and_an_admin_token_on_first_start_only(procs: Procs, env: dict[str, str]) -> None:
    port = free_port()
    env = {**env, "CONVEYOR__API__PORT": str(port)}
    up = procs.start("up", name="up-1", env=env)
    up.wait_for_log("Press Ctrl-C to stop", timeout=30)  # the banner's last line: all of it is out
    assert f"dashboard and API: http://127.0.0.1:{port}" in up.stderr(), up.logs()
    assert "an admin token was created" in up.stderr(), up.logs()
    token = eventually(lambda: up.stdout().strip().splitlines()[-1:], 10, message=up.logs)[0]
    assert TOKEN_LINE.fullmatch(token), up.logs()  # alone on its line on stdout
    url = f"http://127.0.0.1:{port}"
    tokens = httpx.get(f"{url}/api/v1/tokens", headers=bearer(token))
    assert tokens.status_code == 200, tokens.text
    assert [(t["name"], t["role"]) for t in tokens.json()] == [("admin (conveyor up)", "admin")]
    up.signal(signal.SIGTERM)
    assert up.wait(30) == 0, up.logs()

    again = procs.start("up", name="up-2", env=env)
    again.wait_for_log("Press Ctrl-C to stop", timeout=30)
    assert f"dashboard and API: {url}" in again.stderr(), again.logs()
    assert "admin token" not in again.stderr(), again.logs()
    assert TOKEN_LINE.search(again.stdout()) is None, again.logs()
    assert len(httpx.get(f"{url}/api/v1/tokens", headers=bearer(token)).json()) == 1  # the first still works
    response = httpx.post(f"{url}/api/v1/executions", headers=bearer(token), content=SEEDS_BODY)
    assert response.status_code == 201, response.text
    again.signal(signal.SIGTERM)
    assert again.wait(30) == 0, again.logs()
