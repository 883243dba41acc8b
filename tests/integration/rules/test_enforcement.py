"""Rules evaluated against real PostgreSQL: one enforcement per matching (rule, event),
one execution per 'requested' enforcement, and nothing doubled by a second pass."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from prometheus_client import REGISTRY

from conveyor.executor import events as events_module
from conveyor.executor.events import Enforcer
from conveyor.rules.render import Decision, EventRow, RuleRow
from integration.builders import Conn, Pool
from integration.rules.kit import action, emit, enforcements, executions_of, pending, rule, run_pass, trigger


def counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("conveyor_enforcements_total", {"outcome": outcome}) or 0.0


def processed(result: str) -> float:
    return REGISTRY.get_sample_value("conveyor_events_processed_total", {"result": result}) or 0.0


MAIN = {"trigger.branch": {"type": "equals", "pattern": "main"}}


def setup(conn: Conn) -> None:
    action(conn)
    trigger(conn)


async def test_a_matching_rule_makes_one_enforcement_and_one_execution(conn: Conn, pool: Pool) -> None:
    setup(conn)
    rule(conn, criteria=MAIN)
    event = emit(conn, {"branch": "main"})
    result = await run_pass(pool)
    assert result.events == 1
    assert result.outcomes == {"requested": 1}
    [f] = enforcements(conn, event)
    assert f["outcome"] == "requested"
    assert f["rule_ref"] == "test.on_push"
    assert f["parameters"] == {"msg": "main"}
    [e] = executions_of(conn, f["id"])
    assert e["id"] == f["execution"]
    assert e["action_ref"] == "test.echo"
    assert e["parameters"] == {"msg": "main"}
    assert e["requested_by"] == "rule:test.on_push"
    assert e["parent"] is None
    assert pending(conn) == []


async def test_a_non_matching_event_makes_nothing(conn: Conn, pool: Pool) -> None:
    setup(conn)
    rule(conn, criteria=MAIN)
    emit(conn, {"branch": "dev"})
    emit(conn, {"nothing": True})
    result = await run_pass(pool)
    assert result.events == 2
    assert result.outcomes == {}
    assert enforcements(conn) == []
    assert pending(conn) == []


async def test_disabled_template_error_and_request_error(conn: Conn, pool: Pool) -> None:
    setup(conn)
    rule(conn, "test.disabled", criteria=MAIN, enabled=False)
    rule(conn, "test.broken", criteria=MAIN, parameters={"msg": "{{ trigger.missing.deeper }}"})
    rule(conn, "test.unknown", criteria=MAIN, action="test.nowhere")
    rule(conn, "test.invalid", criteria=MAIN, parameters={"msg": 42})
    rule(conn, "test.fine", criteria=MAIN)
    event = emit(conn, {"branch": "main"})
    await run_pass(pool)
    by_rule = {f["rule_ref"]: f for f in enforcements(conn, event)}
    assert by_rule["test.disabled"]["outcome"] == "rule_disabled"
    assert by_rule["test.disabled"]["execution"] is None
    assert by_rule["test.broken"]["outcome"] == "template_error"
    assert "missing" in by_rule["test.broken"]["error"]
    assert by_rule["test.unknown"]["outcome"] == "request_error"
    assert "unknown action" in by_rule["test.unknown"]["error"]
    assert by_rule["test.invalid"]["outcome"] == "request_error"
    assert "invalid parameters" in by_rule["test.invalid"]["error"]
    assert by_rule["test.fine"]["outcome"] == "requested"
    assert executions_of(conn, by_rule["test.fine"]["id"])
    # The refused requests left no execution behind.
    assert conn.execute("SELECT count(*) AS n FROM execution").fetchone() == {"n": 1}


async def test_event_metadata_and_yaql_in_templates(conn: Conn, pool: Pool) -> None:
    setup(conn)
    action(conn, "test.any", {})
    rule(conn, "test.meta", action="test.any",
         parameters={"id": "{{ event.id }}", "src": "<% $.event.source %>", "n": "<% $.trigger.n + 1 %>"})  # fmt: skip
    event = emit(conn, {"n": 41})
    await run_pass(pool)
    [f] = enforcements(conn, event)
    assert f["parameters"] == {"id": event, "src": "api", "n": 42}


async def test_duplicate_processing_changes_nothing(conn: Conn, pool: Pool, db_url: str) -> None:
    """Two executors at once, then a pass replayed with the same decisions (a redelivered
    NOTIFY, a pass retried after a crash): still one enforcement and one execution."""
    setup(conn)
    rule(conn, "test.a", criteria=MAIN)
    rule(conn, "test.b")
    events = [emit(conn, {"branch": "main"}) for _ in range(20)]
    results = await asyncio.gather(*(Enforcer(pool, batch_size=7).run_pass() for _ in range(4)))
    while pending(conn):
        results.append(await run_pass(pool, 7))
    assert sum(r.events for r in results) == 20
    # The same decisions again, straight to the SQL function: the events are no longer pending.
    again = conn.execute(
        "SELECT * FROM enforce_events(%s, (SELECT jsonb_agg(jsonb_build_object('event', f.event, 'rule', f.rule, "
        "'rule_ref', f.rule_ref, 'outcome', 'requested', 'action_ref', 'test.echo', 'parameters', f.parameters)) "
        "FROM enforcement f))",
        (events,),
    ).fetchall()
    assert again == []
    rows = enforcements(conn)
    assert len(rows) == 40
    assert len({(f["rule"], f["event"]) for f in rows}) == 40
    counts = conn.execute("SELECT count(*) AS n, count(DISTINCT enforcement) AS d FROM execution").fetchone()
    assert counts == {"n": 40, "d": 40}


async def test_replay_makes_new_enforcements_against_the_replay(conn: Conn, pool: Pool) -> None:
    setup(conn)
    rule(conn, criteria=MAIN)
    first = emit(conn, {"branch": "main"})
    await run_pass(pool)
    replay = conn.execute("SELECT replay_event(%s) AS id", (first,)).fetchone()["id"]  # type: ignore[index]
    await run_pass(pool)
    [a] = enforcements(conn, first)
    [b] = enforcements(conn, replay)
    assert a["id"] != b["id"]
    assert a["execution"] != b["execution"]
    assert conn.execute("SELECT replay_of FROM event WHERE id = %s", (replay,)).fetchone() == {"replay_of": first}


async def test_a_rule_survives_its_deletion_in_the_record(conn: Conn, pool: Pool) -> None:
    setup(conn)
    rule(conn)
    event = emit(conn, {"branch": "x"})
    await run_pass(pool)
    conn.execute("SELECT delete_rule('test.on_push')")
    [f] = enforcements(conn, event)
    assert f["rule"] is None
    assert f["rule_ref"] == "test.on_push"


async def test_a_poison_event_does_not_hold_up_the_queue(conn: Conn, pool: Pool, monkeypatch: Any) -> None:
    """A decision PostgreSQL refuses to store fails the batch's transaction: the events are
    retried one by one, and the poison one is recorded with its requests refused
    (request_error naming the database's error) rather than retried forever. (A NUL
    character made by a template is caught earlier, as a template_error; to reach the
    fallback, decide() is made to let one through.)"""
    setup(conn)
    rule(conn, "test.nul", criteria={"trigger.n": {"type": "equals", "pattern": 1}}, parameters={"msg": "x"})
    rule(conn, "test.fine")
    real = events_module.decide

    def leaky(rule: RuleRow, event: EventRow, tree: Any = None, *limits: Any) -> Decision | None:
        decision = real(rule, event, tree, *limits)
        if decision is not None and rule.ref == "test.nul":
            return dataclasses.replace(decision, parameters={"msg": "\x00"})
        return decision

    monkeypatch.setattr(events_module, "decide", leaky)
    events = [emit(conn, {"n": n, "branch": "b"}) for n in range(3)]
    result = await run_pass(pool)
    assert result.events == 3
    assert pending(conn) == []
    by = {(f["event"], f["rule_ref"]): f for f in enforcements(conn)}
    assert by[(events[1], "test.nul")]["outcome"] == "request_error"
    assert "\x00" not in by[(events[1], "test.nul")]["error"]
    assert by[(events[1], "test.fine")]["outcome"] == "request_error"  # the whole event is degraded
    assert [by[(e, "test.fine")]["outcome"] for e in (events[0], events[2])] == ["requested", "requested"]


async def test_a_template_making_a_nul_is_a_template_error(conn: Conn, pool: Pool) -> None:
    setup(conn)
    rule(conn, "test.nul", parameters={"msg": "{{ '\\x00' }}"})
    event = emit(conn, {})
    await run_pass(pool)
    [f] = enforcements(conn, event)
    assert f["outcome"] == "template_error"
    assert "NUL" in f["error"]
