"""The four verbs of issue #26 that were not one SQL function -- a schedule's PATCH, a dead
letter's replay, a token's creation and revocation, the operator's purge of dead letters --
are each one function of migration 0035, and nothing else writes what they write: no named
query holds raw DML on their tables besides the other verbs' (pinned here), no Python module
carries SQL that writes them, and each verb's named query is executed only by its verb
module (conveyor.verbs; the SDK, the API and the CLI run the verb)."""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.store.queries import Q

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"
MIGRATIONS = SRC / "store" / "sql" / "migrations"
# A named query run where it is written (Q["x"]) or yielded by a verb (sql("x", ...)).
USED = re.compile(r"""\b(?:Q\[|sql\()\s*["'](\w+)["']""")
DML = r"(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+{table}\b"

# Each verb's named query, the SQL function it is, and the modules that execute it.
VERBS = {
    "patch_schedule": ("patch_schedule", {"verbs/schedules.py"}),
    "replay_dead_letter": ("replay_dead_letter", {"verbs/dead_letters.py"}),
    "purge_dead_letters": ("purge_dead_letters", {"verbs/dead_letters.py"}),
    "create_token": ("create_api_token", {"verbs/tokens.py"}),
    "revoke_token": ("revoke_api_token", {"verbs/tokens.py"}),
}
# The named queries that may still write these tables, and why: other verbs, not these four.
OTHER_WRITERS = {
    "api_token": {"token_by_hash"},  # authentication marks a token used (last_used)
    # The consumer records and resolves letters; retention deletes expired ones.
    "dead_letter": {"record_dead_letter", "resolve_dead_letter", "purge_expired_dead_letters"},
    "schedule": set(),  # every write is a function (create/patch/pause/resume/delete/fire)
}


def _executed_from() -> dict[str, set[str]]:
    where: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for m in USED.finditer(path.read_text(encoding="utf-8")):
            where.setdefault(m.group(1), set()).add(str(path.relative_to(SRC)))
    return where


def test_each_verb_is_one_call_of_its_function() -> None:
    defined = "\n".join(p.read_text(encoding="utf-8") for p in sorted(MIGRATIONS.glob("*.sql")))
    for name, (function, _) in VERBS.items():
        body = "\n".join(line for line in Q[name].splitlines() if not line.lstrip().startswith("--")).strip()
        assert re.fullmatch(rf"SELECT [^;]*\bFROM {function}\([^;]*\);?", body, re.S), (name, body)
        assert re.search(rf"CREATE FUNCTION {function}\(", defined), function


def test_no_other_named_query_writes_their_tables() -> None:
    for table, allowed in OTHER_WRITERS.items():
        writers = {n for n, sql in Q.items() if re.search(DML.format(table=table), sql, re.I)}
        assert writers - allowed == set(), f"raw DML on {table} outside its functions: {sorted(writers - allowed)}"


def test_no_python_module_writes_their_tables() -> None:
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for table in OTHER_WRITERS:
            assert not re.search(DML.format(table=table), text, re.I), f"{path.relative_to(SRC)} writes {table}"


def test_each_verb_is_executed_only_by_its_callers() -> None:
    where = _executed_from()
    for name, (_, callers) in VERBS.items():
        assert where.get(name, set()) == callers, (name, sorted(where.get(name, set())))
    # The replay's former pieces are gone: the lock and the mark are inside its function.
    assert not {"lock_dead_letter", "mark_replayed", "replay_message"} & (set(Q) | set(where))
    # A PATCH no longer replaces the whole row through create_schedule.
    assert where["create_schedule"] == {"verbs/schedules.py"}
    patch_code = (SRC / "verbs/schedules.py").read_text(encoding="utf-8")
    update = patch_code[patch_code.index("def patch(") : patch_code.index("def pause(")]
    assert 'sql("patch_schedule"' in update
    assert 'sql("create_schedule"' not in update
