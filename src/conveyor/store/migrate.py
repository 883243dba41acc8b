"""Numbered, immutable SQL migrations that any number of processes may run at once.

A session-level advisory lock keyed on the schema serializes migrators; each file
is applied in its own transaction together with its ``schema_migration`` row, so a
crash mid-way leaves the schema at a clean version. A database migrated by a newer
Conveyor (a version this code does not know) is refused rather than touched.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from typing import cast

import psycopg
from psycopg import sql

from conveyor.domain.errors import SchemaTooNewError

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def known_migrations() -> list[Migration]:
    folder = resources.files("conveyor.store") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 0001.. without gaps, found {versions}")
    return found


def _lock_key(schema: str) -> int:
    return int.from_bytes(hashlib.sha256(f"conveyor.migrate.{schema}".encode()).digest()[:8], "big", signed=True)


def migrate(url: str, schema: str) -> list[Migration]:
    """Bring ``schema`` up to the newest known version; return what was applied."""
    migrations = known_migrations()
    applied: list[Migration] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_lock_key(schema),))
        try:
            # DDL only when something is missing: a service whose role may read and
            # write but not create can start against a schema migrated beforehand.
            if not _has_migration_table(conn, schema):
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {}.schema_migration ("
                        " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                        " applied timestamptz NOT NULL DEFAULT now())"
                    ).format(sql.Identifier(schema))
                )
            done = _applied(conn, schema)
            _check(done, migrations, schema)
            for migration in migrations:
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
                    conn.execute(
                        "INSERT INTO schema_migration (version, name, checksum) VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                    conn.execute(migration.text.encode())
                applied.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(schema),))
    return applied


def check_version(url: str, schema: str) -> int:
    """Return the schema's version; refuse one that is newer than this code."""
    with psycopg.connect(url, autocommit=True) as conn:
        if not _has_migration_table(conn, schema):
            return 0
        done = _applied(conn, schema)
    _check(done, known_migrations(), schema)
    return max(done, default=0)


@dataclass(frozen=True)
class MigrationState:
    """A known migration and when the schema recorded it applied (``None``: pending)."""

    migration: Migration
    applied: datetime | None


def migration_states(url: str, schema: str) -> list[MigrationState]:
    """Every known migration, applied or pending, in order, without changing anything: a
    database without the schema has them all pending. A schema ``migrate`` would refuse
    (newer, or tampered) is refused here too, with the same error."""
    migrations = known_migrations()
    with psycopg.connect(url, autocommit=True) as conn:
        # What `migrate --status` and `--dry-run` promise (nothing applied) is then the
        # server's to enforce, not only this code's.
        conn.execute("SET default_transaction_read_only = on")
        records = _records(conn, schema) if _has_migration_table(conn, schema) else {}
    _check({version: checksum for version, (checksum, _) in records.items()}, migrations, schema)
    return [MigrationState(m, records[m.version][1] if m.version in records else None) for m in migrations]


def _has_migration_table(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_migration",)).fetchone()
    return bool(row and row[0])


def _applied(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> dict[int, str]:
    return {version: checksum for version, (checksum, _) in _records(conn, schema).items()}


def _records(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> dict[int, tuple[str, datetime]]:
    """version -> (checksum, when applied), as ``schema_migration`` recorded them."""
    rows = conn.execute(
        sql.SQL("SELECT version, checksum, applied FROM {}.schema_migration").format(sql.Identifier(schema))
    ).fetchall()
    return {int(str(v)): (str(c), cast(datetime, a)) for v, c, a in rows}  # applied: timestamptz NOT NULL


def _check(done: dict[int, str], migrations: list[Migration], schema: str) -> None:
    newest = migrations[-1].version if migrations else 0
    if done and max(done) > newest:
        raise SchemaTooNewError(
            f"schema {schema!r} is at version {max(done)}, newer than this Conveyor knows ({newest}); "
            "upgrade Conveyor before running it against this database"
        )
    for migration in migrations:
        if migration.version in done and done[migration.version] != migration.checksum:
            raise SchemaTooNewError(
                f"migration {migration.version:04d}_{migration.name} in schema {schema!r} differs from "
                "this Conveyor's copy; migrations are immutable once applied"
            )
