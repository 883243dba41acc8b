"""Migrations against a real PostgreSQL: idempotent, concurrent on an empty database,
prepared once by concurrent startups, and a newer schema or a tampered checksum refused."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from conveyor.domain.errors import SchemaTooNewError
from conveyor.domain.status import edges
from conveyor.service.app import prepare_database
from conveyor.store.migrate import check_version, known_migrations, migrate, migration_states
from integration.builders import SCHEMA

# ---------------------------------------------------------------------------
# Migrations
# ---------------------------------------------------------------------------


def _migration_rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as c:
        return c.execute(f"SELECT version, name, checksum FROM {SCHEMA}.schema_migration ORDER BY version").fetchall()


def test_migrating_twice_is_a_no_op(db_url: str) -> None:
    before = _migration_rows(db_url)
    assert [r[0] for r in before] == [m.version for m in known_migrations()]
    assert migrate(db_url, SCHEMA) == []
    assert migrate(db_url, SCHEMA) == []
    assert _migration_rows(db_url) == before
    assert check_version(db_url, SCHEMA) == known_migrations()[-1].version


def test_migrating_an_empty_database_then_again(empty_db_url: str) -> None:
    assert check_version(empty_db_url, SCHEMA) == 0
    applied = migrate(empty_db_url, SCHEMA)
    assert [m.version for m in applied] == [m.version for m in known_migrations()]
    assert migrate(empty_db_url, SCHEMA) == []
    rows = _migration_rows(empty_db_url)
    assert [(v, c) for v, _, c in rows] == [(m.version, m.checksum) for m in known_migrations()]


def test_concurrent_migrations_of_an_empty_database(empty_db_url: str) -> None:
    n = 8
    barrier = threading.Barrier(n)

    def run() -> list[int]:
        barrier.wait(timeout=10)
        return [m.version for m in migrate(empty_db_url, SCHEMA)]

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = [f.result(timeout=60) for f in [pool.submit(run) for _ in range(n)]]
    everything = [m.version for m in known_migrations()]
    # Exactly one migrator applied everything; every other one found it done.
    assert sorted(results, key=len, reverse=True) == [everything] + [[]] * (n - 1)
    rows = _migration_rows(empty_db_url)
    assert [r[0] for r in rows] == everything
    with psycopg.connect(empty_db_url) as c:
        assert c.execute(f"SELECT count(*) FROM {SCHEMA}.execution_transition").fetchone()[0] == len(edges())
        # The advisory lock was released by every migrator.
        assert (
            c.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0]
            == 0
        )


def test_concurrent_startups_prepare_the_database_once(empty_db_url: str) -> None:
    """What every service does on start (migrate + record the core pack), all at once."""
    n = 6
    barrier = threading.Barrier(n)

    def run() -> int:
        barrier.wait(timeout=10)
        return len(prepare_database(empty_db_url, SCHEMA))

    with ThreadPoolExecutor(max_workers=n) as pool:
        applied = sorted(f.result(timeout=60) for f in [pool.submit(run) for _ in range(n)])
    assert applied == [0] * (n - 1) + [len(known_migrations())]
    with psycopg.connect(empty_db_url) as c:
        refs = [r[0] for r in c.execute(f"SELECT ref FROM {SCHEMA}.action ORDER BY ref").fetchall()]
    assert refs == ["core.ask", "core.echo", "core.local", "core.noop", "core.sleep"]  # core.ask: migration 0013


def test_migration_states_read_what_is_applied_and_change_nothing(empty_db_url: str) -> None:
    """What `conveyor migrate --status|--dry-run` show: a database without the schema has
    every migration pending (and still no schema afterwards); one migrated has each applied
    at the time its row recorded; one whose newest rows are missing has those pending."""
    everything = [m.version for m in known_migrations()]
    states = migration_states(empty_db_url, SCHEMA)
    assert [(s.migration.version, s.applied) for s in states] == [(v, None) for v in everything]
    with psycopg.connect(empty_db_url) as c:
        assert c.execute("SELECT to_regnamespace(%s)", (SCHEMA,)).fetchone() == (None,)

    migrate(empty_db_url, SCHEMA)
    with psycopg.connect(empty_db_url) as c:
        recorded = dict(c.execute(f"SELECT version, applied FROM {SCHEMA}.schema_migration").fetchall())
        c.execute(f"DELETE FROM {SCHEMA}.schema_migration WHERE version > %s", (everything[-3],))
    assert [(s.migration.version, s.applied) for s in migration_states(empty_db_url, SCHEMA)] == [
        (v, recorded[v] if v <= everything[-3] else None) for v in everything
    ]
    assert all(recorded.values())
    assert [r[0] for r in _migration_rows(empty_db_url)] == everything[:-2]  # read, not migrated


def test_a_newer_schema_is_refused(db_url: str) -> None:
    newest = known_migrations()[-1].version
    with psycopg.connect(db_url) as c:
        c.execute(
            f"INSERT INTO {SCHEMA}.schema_migration (version, name, checksum) VALUES (%s, 'future', 'x')", (newest + 1,)
        )
    with pytest.raises(SchemaTooNewError, match=rf"version {newest + 1}, newer than this Conveyor knows"):
        migrate(db_url, SCHEMA)
    with pytest.raises(SchemaTooNewError, match="upgrade Conveyor"):
        check_version(db_url, SCHEMA)
    with pytest.raises(SchemaTooNewError, match="upgrade Conveyor"):
        migration_states(db_url, SCHEMA)  # what `migrate --status` says, as `migrate` would
    assert [r[0] for r in _migration_rows(db_url)] == [*range(1, newest + 1), newest + 1]


def test_a_tampered_checksum_is_refused(db_url: str) -> None:
    with psycopg.connect(db_url) as c:
        c.execute(f"UPDATE {SCHEMA}.schema_migration SET checksum = 'tampered' WHERE version = 1")
    with pytest.raises(SchemaTooNewError, match="immutable"):
        migrate(db_url, SCHEMA)
    with pytest.raises(SchemaTooNewError, match=r"0001_initial .* differs"):
        check_version(db_url, SCHEMA)


def test_a_newer_schema_of_expand_migrations_is_used(db_url: str) -> None:
    """A rolling upgrade: the next release applied migrations that declare this code's
    version compatible (``-- compatible-from``); this code starts against them, applies
    nothing, and refuses as soon as one of them is a contract migration."""
    newest = known_migrations()[-1].version
    insert = (
        f"INSERT INTO {SCHEMA}.schema_migration (version, name, checksum, compatible_from) VALUES (%s, %s, 'x', %s)"
    )
    with psycopg.connect(db_url) as c:
        c.execute(insert, (newest + 1, "future_expand", newest))
        c.execute(insert, (newest + 2, "future_expand_too", newest - 1))
    assert migrate(db_url, SCHEMA) == []
    assert check_version(db_url, SCHEMA) == newest + 2
    assert [s.migration.version for s in migration_states(db_url, SCHEMA)][-1] == newest
    with psycopg.connect(db_url) as c:
        c.execute(insert, (newest + 3, "future_contract", newest + 3))
    with pytest.raises(SchemaTooNewError, match=rf"migration {newest + 3} needs code that knows version {newest + 3}"):
        migrate(db_url, SCHEMA)


def test_each_migration_records_what_it_declares(db_url: str) -> None:
    with psycopg.connect(db_url) as c:
        recorded = dict(c.execute(f"SELECT version, compatible_from FROM {SCHEMA}.schema_migration").fetchall())
    declared = {m.version: m.compatible_from for m in known_migrations()}
    assert declared[31] == 30  # 0031 only adds a column: the previous release runs on
    # Rows from before 0031 recorded nothing (read as their own version); later ones what they declare.
    assert recorded == {v: (c if v >= 31 else None) for v, c in declared.items()}
