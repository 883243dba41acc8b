"""Acceptance: webhooks as an operator and a sender meet them. ``conveyor webhooks`` sets
one up (the secret generated and printed once, or read from the environment), a real
``conveyor api`` process serves its door, and GitHub-like requests (raw bytes, signed
with HMAC-SHA256) make exactly one event each; the CLI never shows a secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, describe

pytestmark = pytest.mark.acceptance
Db = psycopg.Connection[dict[str, Any]]
PUSH = b'{"ref": "refs/heads/main", "repository": {"full_name": "octo/hello"}}'


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_api(procs: Procs) -> str:
    port = free_port()
    api = procs.start("api", name="api", env={**procs.env, "CONVEYOR__API__PORT": str(port)})
    api.wait_for_log("API listening", timeout=30)
    return f"http://127.0.0.1:{port}"


def github(secret: str, body: bytes, delivery: str) -> dict[str, str]:
    """The headers GitHub sends (the signature as `openssl dgst -sha256 -hmac` computes it)."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": f"sha256={digest}", "User-Agent": "GitHub-Hookshot/test"}  # fmt: skip


def docs_curl_example(url: str, secret: str) -> dict[str, Any]:
    """Run the curl + openssl example of docs/webhooks.md as written (its secret and URL
    swapped for this test's): the documentation's signature recipe must be right."""
    doc = (Path(__file__).parents[2] / "docs" / "webhooks.md").read_text()
    section = doc.split("### Trying it with curl and openssl", 1)[1]
    script = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert script is not None
    lines = [ln for ln in script.group(1).splitlines() if not ln.startswith(("SECRET=", "#"))]
    text = "\n".join(lines).replace("http://127.0.0.1:8080", url)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], env={"SECRET": secret, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def ok(procs: Procs, *args: str, env: dict[str, str] | None = None) -> str:
    result = procs.run(*args, env=env)
    assert result.returncode == 0, describe(result)
    return result.stdout


def test_github_webhook_end_to_end(procs: Procs, db: Db) -> None:
    created = procs.run("webhooks", "create", "github", "--generate-secret", "--idempotency-header",
                        "X-GitHub-Delivery", "--description", "pushes to octo/hello")  # fmt: skip
    assert created.returncode == 0, describe(created)
    secret = created.stdout.strip()
    assert len(secret) >= 40
    assert "shown only now" in created.stderr
    url = start_api(procs)
    with httpx.Client(base_url=url, timeout=10) as client:
        first = client.post("/api/v1/webhooks/github", content=PUSH, headers=github(secret, PUSH, "d-1"))
        assert first.status_code == 202, first.text
        again = client.post("/api/v1/webhooks/github", content=PUSH, headers=github(secret, PUSH, "d-1"))
        assert again.status_code == 202
        assert again.json()["event_id"] == first.json()["event_id"]
        assert again.headers["Idempotent-Replayed"] == "true"
        forged = client.post("/api/v1/webhooks/github", content=PUSH, headers=github("guess", PUSH, "d-2"))
        assert forged.status_code == 401
        unsigned = client.post("/api/v1/webhooks/github", json={"ref": "x"})
        assert unsigned.status_code == 401
        assert docs_curl_example(url, secret)["repeated"] is False
        metrics = client.get("/metrics").text
        assert 'conveyor_webhook_requests_total{code="202",webhook="github"} 3.0' in metrics
        assert 'conveyor_webhook_requests_total{code="401",webhook="github"} 2.0' in metrics
    rows = db.execute("SELECT trigger, source, idempotency_key, payload FROM event ORDER BY id").fetchall()
    keys = [(r["trigger"], r["source"], r["idempotency_key"]) for r in rows]
    assert keys == [("github", "webhook", "d-1"), ("github", "webhook", "72d3162e-cc78-11e3-81ab-4c9367dc0958")]
    assert rows[1]["payload"]["headers"]["x-github-event"] == "ping"
    assert rows[0]["payload"]["body"] == json.loads(PUSH)
    assert rows[0]["payload"]["headers"]["x-github-event"] == "push"

    listed = ok(procs, "webhooks", "list")
    shown = ok(procs, "webhooks", "get", "github")
    as_json = ok(procs, "webhooks", "get", "github", "--json")
    for text in (listed, shown, as_json):
        assert secret not in text
    assert "secret set" in shown
    assert json.loads(as_json)["events"] == 2

    ok(procs, "webhooks", "disable", "github")
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.post("/api/v1/webhooks/github", content=PUSH, headers=github(secret, PUSH, "d-3")).status_code \
            == 404  # fmt: skip
        ok(procs, "webhooks", "enable", "github")
        assert client.post("/api/v1/webhooks/github", content=PUSH, headers=github(secret, PUSH, "d-3")).status_code \
            == 202  # fmt: skip
        ok(procs, "webhooks", "delete", "github")
        assert client.post("/api/v1/webhooks/github", content=PUSH, headers=github(secret, PUSH, "d-4")).status_code \
            == 404  # fmt: skip
    assert db.execute("SELECT count(*) AS n FROM event").fetchone() == {"n": 3}


def test_secrets_from_the_environment_and_errors_on_one_line(procs: Procs, db: Db, tmp_path: Any) -> None:
    env = {**procs.env, "HOOK_SECRET": "from-env", "HOOK_TOKEN": "tok-123"}
    ok(procs, "webhooks", "create", "a", "--hmac-secret-env", "HOOK_SECRET", env=env)
    ok(procs, "webhooks", "create", "b", "--bearer-token-env", "HOOK_TOKEN", env=env)
    (tmp_path / "secret").write_text("from-file\n")
    (tmp_path / "schema.json").write_text('{"type": "object", "required": ["body"]}')
    ok(procs, "webhooks", "create", "c", "--hmac-secret-file", str(tmp_path / "secret"),
       "--schema", str(tmp_path / "schema.json"), "--max-body", "500")  # fmt: skip
    stored = {r["name"]: r for r in db.execute("SELECT name, secret, token_hash FROM webhook").fetchall()}
    assert stored["a"]["secret"] == "from-env"
    assert stored["c"]["secret"] == "from-file"
    assert stored["b"]["token_hash"] == hashlib.sha256(b"tok-123").hexdigest()
    for args in (
        ("webhooks", "create", "d", "--no-auth", "--generate-secret"),
        ("webhooks", "create", "d", "--hmac-secret-env", "UNSET_VARIABLE_X"),
        ("webhooks", "create", "d", "--no-auth", "--signature-header", "bad header"),
        ("webhooks", "get", "nope"),
        ("webhooks", "delete", "nope"),
    ):
        result = procs.run(*args)
        assert result.returncode != 0, describe(result)
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, describe(result)
    assert "from-env" not in ok(procs, "webhooks", "list", "--json")
