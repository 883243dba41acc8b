"""Numbered, immutable SQL migrations that any number of processes may run at once.

A session-level advisory lock keyed on the schema serializes migrators; each file
is applied in its own transaction together with its ``schema_migration`` row, so a
crash mid-way leaves the schema at a clean version.

A database migrated by a newer Conveyor is used only when every migration this code does
not know declared itself compatible with a version it knows (``-- compatible-from: N``
in the migration's first lines, recorded in ``schema_migration.compatible_from``,
migration 0031): the previous release keeps running -- and restarting -- through a rolling
upgrade whose migrations only expand the schema. Otherwise it is refused, never touched.
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
_COMPATIBLE = re.compile(r"^--\s*compatible-from:\s*(\d+)\s*$", re.MULTILINE)
# The migration that adds schema_migration.compatible_from: its row and later ones record it.
COMPATIBILITY_SINCE = 31


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def compatible_from(self) -> int:
        """The oldest schema version whose code works once this is applied: what its
        header declares (an expand migration), else its own version (a contract one)."""
        header = self.text.split("\n\n", 1)[0]  # the leading comment block only
        match = _COMPATIBLE.search(header)
        return int(match[1]) if match else self.version


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
    for m in found:
        if not 1 <= m.compatible_from <= m.version:
            raise RuntimeError(f"migration {m.version:04d}_{m.name} declares compatible-from {m.compatible_from}")
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
                    conn.execute(migration.text.encode())
                    # After the text: migration 0031 adds the column its own row records.
                    if migration.version >= COMPATIBILITY_SINCE:
                        conn.execute(
                            "INSERT INTO schema_migration (version, name, checksum, compatible_from)"
                            " VALUES (%s, %s, %s, %s)",
                            (migration.version, migration.name, migration.checksum, migration.compatible_from),
                        )
                    else:
                        conn.execute(
                            "INSERT INTO schema_migration (version, name, checksum) VALUES (%s, %s, %s)",
                            (migration.version, migration.name, migration.checksum),
                        )
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
        records = _applied(conn, schema) if _has_migration_table(conn, schema) else {}
    _check(records, migrations, schema)
    return [MigrationState(m, records[m.version].applied if m.version in records else None) for m in migrations]


def _has_migration_table(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_migration",)).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class Applied:
    """A migration as ``schema_migration`` recorded it."""

    checksum: str
    applied: datetime
    compatible_from: int  # its own version when it declared nothing (or predates 0031)


def _applied(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> dict[int, Applied]:
    """version -> what ``schema_migration`` recorded. ``to_jsonb`` reads compatible_from on
    a schema that has the column and NULL on one migrated before 0031 alike."""
    rows = conn.execute(
        sql.SQL(
            "SELECT version, checksum, applied, (to_jsonb(m) ->> 'compatible_from')::integer FROM {}.schema_migration m"
        ).format(sql.Identifier(schema))
    ).fetchall()
    found = {}
    for v, c, a, compatible in rows:
        version = int(str(v))
        since = int(str(compatible)) if compatible is not None else version
        found[version] = Applied(str(c), cast(datetime, a), since)  # applied: timestamptz NOT NULL
    return found


def _check(done: dict[int, Applied], migrations: list[Migration], schema: str) -> None:
    newest = migrations[-1].version if migrations else 0
    unknown = sorted(v for v in done if v > newest)
    blocking = [v for v in unknown if done[v].compatible_from > newest]
    if blocking:
        raise SchemaTooNewError(
            f"schema {schema!r} is at version {max(done)}, newer than this Conveyor knows ({newest}), and "
            f"migration {blocking[0]} needs code that knows version {done[blocking[0]].compatible_from}; "
            "upgrade Conveyor before running it against this database"
        )
    for migration in migrations:
        if migration.version in done and done[migration.version].checksum != migration.checksum:
            raise SchemaTooNewError(
                f"migration {migration.version:04d}_{migration.name} in schema {schema!r} differs from "
                "this Conveyor's copy; migrations are immutable once applied"
            )
