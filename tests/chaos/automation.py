"""Events, rules, webhooks and schedules under chaos (issue #13): what the run sets up
(a webhook with an HMAC secret, a custom trigger, rules on both, schedules firing every
second with different overlap and catch-up policies) and the two loads: signed webhook
deliveries POSTed to the run's ``conveyor api`` (some sent again with the same delivery
key, and every one retried with its key through outages) and custom events emitted through
the SDK. The checks are in automation_checks.py; the rules' criteria are restated there
as Python predicates (RULES below), so the expected enforcements are computed without the
product's own matcher.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from psycopg.types.json import Jsonb

from conveyor.sdk import Client

from .faults import connect

WEBHOOK = "chaos-hook"
HOOK_TRIGGER = "chaos.hook"
CUSTOM_TRIGGER = "chaos.custom"
SECRET = "chaos-webhook-secret"

# (ref, trigger, criteria, action, parameters, the criteria as a Python predicate on the payload)
Rule = tuple[str, str, dict[str, Any], str, dict[str, Any], Callable[[dict[str, Any]], bool]]
RULES: list[Rule] = [
    ("chaos.hook_fast", HOOK_TRIGGER, {"trigger.body.kind": {"type": "equals", "pattern": "fast"}},
     "chaos.fast", {"n": "{{ trigger.body.n }}"}, lambda p: p.get("body", {}).get("kind") == "fast"),
    ("chaos.hook_any", HOOK_TRIGGER, {}, "chaos.fast", {"n": "<% $.trigger.body.n %>"}, lambda p: True),
    ("chaos.custom_big", CUSTOM_TRIGGER, {"trigger.size": {"type": "gt", "pattern": 50}},
     "chaos.fast", {"n": "{{ trigger.n }}"}, lambda p: isinstance(p.get("size"), int) and p["size"] > 50),
    ("chaos.custom_color", CUSTOM_TRIGGER,
     {"or": [{"trigger.color": {"type": "in", "pattern": ["red", "blue"]}},
             {"trigger.tags": {"type": "contains", "pattern": "urgent"}}]},
     "chaos.slow", {"n": "{{ trigger.n }}", "seconds": 0.2},
     lambda p: p.get("color") in ("red", "blue") or "urgent" in (p.get("tags") or [])),
]  # fmt: skip

# name -> fields for create_schedule: every second, each overlap and catch-up policy.
SCHEDULES: dict[str, dict[str, Any]] = {
    "chaos-every-all": {"every": "1s", "action": "chaos.fast", "parameters": {"n": 0}, "catchup": "all"},
    "chaos-cron-latest": {"cron": "* * * * * *", "action": "chaos.fast", "parameters": {"n": 0},
                          "catchup": "latest", "overlap": "skip"},
    "chaos-slow-skip": {"every": "1s", "action": "chaos.slow", "parameters": {"n": 0, "seconds": 1.5},
                        "catchup": "skip", "overlap": "skip"},
    "chaos-slow-buffer": {"every": "1s", "action": "chaos.slow", "parameters": {"n": 0, "seconds": 1.5},
                          "catchup": "latest", "overlap": "buffer_one"},
    "chaos-slow-cancel": {"every": "1s", "action": "chaos.slow", "parameters": {"n": 0, "seconds": 1.5},
                          "catchup": "all", "overlap": "cancel_previous"},
}  # fmt: skip

EVENT_POINTS = ("events.after_claim", "events.after_enforcement", "events.before_commit", "events.after_commit")
SCHEDULE_POINTS = ("schedules.after_slot_row", "schedules.before_commit", "schedules.after_commit")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_url(env: dict[str, str]) -> str:
    return f"http://127.0.0.1:{env['CONVEYOR__API__PORT']}"


def set_up(db_url: str) -> None:
    """The webhook, the custom trigger, the rules and the schedules, through the verbs
    (their SQL functions: the SDK has no webhook method)."""
    with Client(db_url) as client:
        with client.conn.transaction():
            client.conn.execute(
                "SELECT * FROM register_webhook(%s, %s, 'hmac', secret => %s)", (WEBHOOK, HOOK_TRIGGER, SECRET)
            )
            client.conn.execute("SELECT register_trigger(%s, 'custom')", (CUSTOM_TRIGGER,))
        client.register_rules([
            {"ref": ref, "trigger": trig, "criteria": crit, "action": {"ref": act, "parameters": params}}
            for ref, trig, crit, act, params, _ in RULES
        ])  # fmt: skip
        for name, fields in SCHEDULES.items():
            client.create_schedule(name, **fields)


def pause_schedules(db_url: str) -> bool:
    """At the end of the chaos: the settle waits for every execution to end."""
    with Client(db_url) as client:
        for name in SCHEDULES:
            client.pause_schedule(name)
    return True


class WebhookSender(threading.Thread):
    """POSTs ``rate`` signed deliveries a second; about one in five is delivered again later
    with the same key (a sender's retry); a delivery refused by an outage (connection error,
    5xx) is retried with its key until it is accepted or the run is over."""

    def __init__(self, base_url: str, rate: float, seed: int) -> None:
        super().__init__(name="chaos-webhooks", daemon=True)
        self.url = f"{base_url}/api/v1/webhooks/{WEBHOOK}"
        self.rate = rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.accepted: dict[str, int] = {}  # key -> event id (first answer)
        self.tried: set[str] = set()  # keys POSTed at least once (an answer lost still made its event)
        self.answers: Counter[str] = Counter()  # 202, 202 repeated, 503, connection error...
        self.problems: list[str] = []  # answers a correct delivery must never get
        self.sent = 0

    def run(self) -> None:
        todo: list[tuple[float, str, bytes]] = []  # (due, key, body)
        try:
            with httpx.Client(timeout=10) as http:
                n = 0
                next_new = time.monotonic()
                while not self.stop.is_set():
                    now = time.monotonic()
                    if now >= next_new:
                        n += 1
                        kind = self.rng.choice(["fast", "fast", "other"])
                        body = json.dumps({"kind": kind, "n": n}).encode()
                        todo.append((now, f"d-{n}", body))
                        if self.rng.random() < 0.2:
                            todo.append((now + self.rng.uniform(0.3, 3), f"d-{n}", body))
                        next_new = now + 1 / self.rate
                    due = [t for t in todo if t[0] <= now]
                    todo = [t for t in todo if t[0] > now]
                    for _, key, body in due:
                        if not self._post(http, key, body):
                            todo.append((time.monotonic() + 0.5, key, body))
                    self.stop.wait(0.02)
        except BaseException as exc:
            self.error = exc

    def _post(self, http: httpx.Client, key: str, body: bytes) -> bool:
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": signature, "Idempotency-Key": key}
        self.sent += 1
        self.tried.add(key)
        try:
            r = http.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self.answers[type(exc).__name__] += 1
            return False
        if r.status_code >= 500:
            self.answers[str(r.status_code)] += 1
            return False
        if r.status_code != 202:
            self.answers[str(r.status_code)] += 1
            self.problems.append(f"delivery {key}: HTTP {r.status_code} {r.text[:200]}")
            return True
        answer = r.json()
        self.answers["202 repeated" if answer["repeated"] else "202"] += 1
        first = self.accepted.setdefault(key, answer["event_id"])
        if first != answer["event_id"]:
            self.problems.append(f"delivery {key}: event {answer['event_id']}, earlier {first}")
        return True


def _sdk_emit() -> Callable[..., Any] | None:
    """The SDK's ``emit_event_once`` where the SDK has it (conveyor.sdk.events)."""
    try:
        module = importlib.import_module("conveyor.sdk.events")
    except ImportError:
        return None
    found: Callable[..., Any] | None = getattr(module, "emit_event_once", None)
    return found


class EventEmitter(threading.Thread):
    """Emits ``rate`` custom events a second, each with a key (retried with it through
    outages: one event however often it is sent)."""

    def __init__(self, db_url: str, rate: float, seed: int) -> None:
        super().__init__(name="chaos-events", daemon=True)
        self.db_url = db_url
        self.rate = rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.emitted: dict[str, int] = {}  # key -> event id
        self.tried: set[str] = set()
        self.retries = 0
        self.emit = _sdk_emit()

    def _payload(self, n: int) -> dict[str, Any]:
        payload: dict[str, Any] = {"n": n, "size": self.rng.randint(0, 100)}
        if self.rng.random() < 0.5:
            payload["color"] = self.rng.choice(["red", "green", "blue", "black"])
        if self.rng.random() < 0.3:
            payload["tags"] = self.rng.sample(["urgent", "late", "new"], 2)
        return payload

    def run(self) -> None:
        n = 0
        conn: psycopg.Connection[dict[str, Any]] | None = None
        try:
            while not self.stop.wait(1 / self.rate):
                n += 1
                key, payload = f"c-{n}", self._payload(n)
                self.tried.add(key)
                while not self.stop.is_set():
                    try:
                        if conn is None or conn.closed:
                            conn = connect(self.db_url)
                        self.emitted[key] = self._emit(conn, key, payload)
                        break
                    except psycopg.OperationalError:
                        self.retries += 1
                        conn = None
                        self.stop.wait(0.3)
        except BaseException as exc:
            self.error = exc
        finally:
            if conn is not None:
                conn.close()

    def _emit(self, conn: psycopg.Connection[dict[str, Any]], key: str, payload: dict[str, Any]) -> int:
        with conn.transaction():
            if self.emit is not None:
                event_id, _ = self.emit(conn, CUSTOM_TRIGGER, payload, idempotency_key=key)
                return int(event_id)
            row = conn.execute(
                "SELECT event_id FROM emit_event_once(%s, %s, 'sdk', %s)", (CUSTOM_TRIGGER, Jsonb(payload), key)
            ).fetchone()
            assert row is not None
            return int(row["event_id"])
