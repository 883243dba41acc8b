"""A verb is written once (issue #26): every named query that changes state is executed
from exactly one module. The state-changing queries are found, not listed: a query holding
DML, or calling one of Conveyor's VOLATILE SQL functions (read from pg_proc of a migrated
database, so a new verb function is covered the day it is written). Where a query runs is
read from the source: ``Q["name"]`` and the verb drivers' ``sql("name", ...)``."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from conveyor.store.queries import Q

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"
USED = re.compile(r"""(?:\bQ\[\s*|\bsql\(\s*)["'](\w+)["']""")
# UPDATE's target may have an alias (UPDATE execution e SET ...); FOR UPDATE is a lock, not a write.
DML = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE\s+\w+(?:\s+(?:AS\s+)?\w+)?\s+SET|DELETE\s+FROM|MERGE\s+INTO|TRUNCATE)\b", re.I
)


def _volatile_functions(conn: psycopg.Connection[dict[str, object]]) -> set[str]:
    rows = conn.execute(
        "SELECT DISTINCT p.proname AS name FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'conveyor' AND p.provolatile = 'v' AND p.prokind = 'f'"
        " AND p.prorettype <> 'trigger'::regtype"
    ).fetchall()
    return {str(r["name"]) for r in rows}


def state_changing(conn: psycopg.Connection[dict[str, object]]) -> dict[str, str]:
    """name -> why (the DML, or the volatile function it calls)."""
    calls = re.compile(r"\b(" + "|".join(sorted(_volatile_functions(conn))) + r")\s*\(", re.I)
    found: dict[str, str] = {}
    for name, text in Q.items():
        if m := DML.search(text) or calls.search(text):
            found[name] = m.group(0)
    return found


def executed_from() -> dict[str, set[str]]:
    where: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        if path == SRC / "store" / "queries.py":  # the loader: its docstring's example
            continue
        for m in USED.finditer(path.read_text(encoding="utf-8")):
            where.setdefault(m.group(1), set()).add(str(path.relative_to(SRC)))
    return where


def test_the_classifier_sees_verbs_and_reads(conn: psycopg.Connection[dict[str, object]]) -> None:
    found = state_changing(conn)
    # Verbs of every kind are seen (a function call; DML), and reads are not.
    assert {"cancel_execution", "patch_schedule", "respond_inquiry", "claim_requested"} <= found.keys()
    assert not {"get_execution", "list_workers", "list_rules"} & found.keys()


def test_each_state_changing_query_is_executed_from_one_module(conn: psycopg.Connection[dict[str, object]]) -> None:
    where = executed_from()
    shared = {name: sorted(where[name]) for name in state_changing(conn) if len(where.get(name, ())) > 1}
    assert shared == {}, f"state-changing named queries executed from more than one module: {shared}"
