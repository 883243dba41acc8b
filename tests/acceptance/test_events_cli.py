"""Acceptance: triggers, events and enforcements from the command line (real ``conveyor``
processes against a test database): register a trigger with a schema file, emit with
key=value pairs, a payload file or standard input and an idempotency key, list, get with
the enforcements a rule made, replay one event and a window, delete; every refusal one
line on stderr, no traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pytest

from acceptance.helpers import CONVEYOR, Procs, conveyor_env, describe

pytestmark = pytest.mark.acceptance

SCHEMA = {"type": "object", "properties": {"service": {"type": "string"}, "replicas": {"type": "integer"}},
          "required": ["service"]}  # fmt: skip


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def refused(procs: Procs, *args: str) -> str:
    result = procs.run(*args)
    assert result.returncode == 1, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert result.stderr.count("\n") == 1, describe(result)
    return result.stderr.strip()


def test_triggers_events_and_enforcements(procs: Procs, tmp_path: Path, db_url: str) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    registered = procs.json("triggers", "register", "deploys", "--schema", str(schema), "--description", "done")
    assert (registered["created_now"], registered["payload_schema"], registered["type"]) == (True, SCHEMA, "custom")
    assert [t["name"] for t in procs.json("triggers", "list")] == ["deploys"]
    shown = procs.run("triggers", "get", "deploys")
    assert shown.returncode == 0, describe(shown)
    assert '"required": ["service"]' in shown.stdout, describe(shown)

    plain = procs.run("events", "emit", "deploys", "service=api", "replicas=3")
    assert plain.returncode == 0, describe(plain)
    first = int(plain.stdout.strip())
    keyed = procs.json("events", "emit", "deploys", "service=db", "--idempotency-key", "k1")
    assert procs.json("events", "emit", "deploys", "service=db", "--idempotency-key", "k1") == {
        "id": keyed["id"], "repeated": True}  # fmt: skip
    payload = tmp_path / "payload.json"
    payload.write_text('{"service": "web"}')
    from_file = procs.json("events", "emit", "deploys", "--payload-file", str(payload))
    piped = subprocess.run([*CONVEYOR, "events", "emit", "deploys", "--payload-file", "-", "--json"],
                           input='{"service": "cache"}', env=procs.env, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert piped.returncode == 0, describe(piped)

    assert refused(procs, "events", "emit", "deploys", "replicas=x") == (
        "error: invalid payload for trigger deploys: payload: 'service' is a required property; "
        "payload.replicas: 'x' is not of type 'integer'")  # fmt: skip
    assert refused(procs, "events", "emit", "nope", "a=1").startswith("error: unknown trigger 'nope'")
    assert "already used for another event" in refused(
        procs, "events", "emit", "deploys", "service=x", "--idempotency-key", "k1")  # fmt: skip
    assert "cannot read it" in refused(procs, "events", "emit", "deploys", "--payload-file", str(schema) + "x")
    (tmp_path / "broken.json").write_text("{service")
    assert "not JSON" in refused(procs, "events", "emit", "deploys", "--payload-file", str(tmp_path / "broken.json"))
    assert refused(procs, "triggers", "register", "bad name").startswith("error: invalid trigger name 'bad name'")
    bad_schema = tmp_path / "bad.json"
    bad_schema.write_text('{"type": 5}')
    assert "is not a valid JSON Schema" in refused(procs, "triggers", "register", "x", "--schema", str(bad_schema))
    assert "still in use" in refused(procs, "triggers", "delete", "deploys")
    assert refused(procs, "events", "get", "999") == "error: no event with id 999 (see `conveyor events list`)"

    listed = procs.json("events", "list", "--trigger", "deploys", "--limit", "10")
    assert [e["id"] for e in listed] == [json.loads(piped.stdout)["id"], from_file["id"], keyed["id"], first]
    assert [e["payload"] for e in listed][-1] == {"service": "api", "replicas": 3}

    with psycopg.connect(db_url) as conn:  # an enforcement, as the rules engine writes one
        conn.execute("SET search_path TO conveyor")
        rule = conn.execute("SELECT rule_id FROM register_rule('deploys.echo', 'deploys', '{}', 'core.echo', '{}')")
        conn.execute("INSERT INTO enforcement (rule, rule_ref, event, outcome, error) VALUES (%s, 'deploys.echo', %s,"
                     " 'template_error', 'no such key')", (rule.fetchone()[0], first))  # fmt: skip
    event = procs.json("events", "get", str(first))
    assert [(n["rule_ref"], n["outcome"], n["error"]) for n in event["enforcements"]] == [
        ("deploys.echo", "template_error", "no such key")]  # fmt: skip
    table = procs.run("events", "get", str(first))
    assert "deploys.echo" in table.stdout, describe(table)
    assert "template_error" in table.stdout, describe(table)
    enforcements = procs.json("enforcements", "list", "--rule", "deploys.echo", "--outcome", "template_error")
    assert [n["event"] for n in enforcements] == [first]
    assert procs.json("enforcements", "get", str(enforcements[0]["id"]))["trigger"] == "deploys"

    replay = procs.json("events", "replay", str(first))
    assert replay["replay_of"] == first
    window = procs.json("events", "replay", "--trigger", "deploys", "--since", "1h")
    assert [p["original"] for p in window] == [first, keyed["id"], from_file["id"], json.loads(piped.stdout)["id"]]
    assert "--since" in refused(procs, "events", "replay", "--trigger", "deploys", "--since", "yesterday")
    assert (
        refused(procs, "events", "replay") == "error: give an event id, or --trigger with --since (and maybe --until)"
    )

    procs.json("triggers", "register", "spare")
    assert procs.json("triggers", "delete", "spare") == {"deleted": "spare"}
    assert refused(procs, "triggers", "get", "spare").startswith("error: unknown trigger 'spare'")
