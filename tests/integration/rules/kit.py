"""Helpers for the rules tests: triggers, actions and rules written through their SQL
verbs (the one write path), events emitted, and a pass of the real Enforcer."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from conveyor.executor.events import Enforcer, PassResult
from conveyor.rules import parse
from conveyor.verbs.rules import register_args
from integration.builders import Conn, Pool

SCHEMA = {"type": "object", "properties": {"msg": {"type": "string"}}, "required": ["msg"]}


def action(conn: Conn, ref: str = "test.echo", schema: dict[str, Any] | None = None) -> str:
    pack, name = ref.split(".", 1)
    conn.execute(
        "INSERT INTO action (ref, pack, name, runner_type, runtime, parameters_schema) "
        "VALUES (%s, %s, %s, 'python', 'python', %s) ON CONFLICT DO NOTHING",
        (ref, pack, name, Jsonb(SCHEMA if schema is None else schema)),
    )
    return ref


def trigger(conn: Conn, name: str = "test.push") -> str:
    conn.execute("SELECT register_trigger(%s, 'custom')", (name,))
    return name


def rule(conn: Conn, ref: str = "test.on_push", *, trigger: str = "test.push", action: str = "test.echo",
         criteria: dict[str, Any] | None = None, parameters: dict[str, Any] | None = None,
         enabled: bool = True) -> int:  # fmt: skip
    params = {"msg": "{{ trigger.branch }}"} if parameters is None else parameters
    doc = {"ref": ref, "trigger": trigger, "enabled": enabled, "criteria": criteria or {},
           "action": {"ref": action, "parameters": params}}  # fmt: skip
    row = conn.execute(
        "SELECT rule_id FROM register_rule(%(ref)s, %(trigger)s, %(criteria)s, %(action_ref)s, %(parameters)s, "
        "%(enabled)s, %(description)s, %(definition)s)",
        register_args(parse.parse(doc)),
    ).fetchone()
    assert row is not None
    return int(row["rule_id"])


def emit(conn: Conn, payload: dict[str, Any], trigger: str = "test.push") -> int:
    row = conn.execute("SELECT emit_event(%s, %s, 'api') AS id", (trigger, Jsonb(payload))).fetchone()
    assert row is not None
    return int(row["id"])


async def run_pass(pool: Pool, batch_size: int = 100) -> PassResult:
    return await Enforcer(pool, batch_size=batch_size).run_pass()


def enforcements(conn: Conn, event: int | None = None) -> list[dict[str, Any]]:
    return list(conn.execute(
        "SELECT * FROM enforcement WHERE %(e)s::bigint IS NULL OR event = %(e)s ORDER BY id", {"e": event}
    ).fetchall())  # fmt: skip


def executions_of(conn: Conn, enforcement: int) -> list[dict[str, Any]]:
    return list(conn.execute("SELECT * FROM execution WHERE enforcement = %s", (enforcement,)).fetchall())


def pending(conn: Conn) -> list[int]:
    return [r["event"] for r in conn.execute("SELECT event FROM event_pending ORDER BY event").fetchall()]
