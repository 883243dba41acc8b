"""Acceptance: the commands that explain the installation (issue #15) run as a user would:
``conveyor --version``, ``conveyor migrate --status|--dry-run``, ``conveyor db url`` and
``conveyor psql``, against a real PostgreSQL. (The embedded one: test_cli_embedded_postgres.)"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, describe
from conveyor.store.migrate import known_migrations

pytestmark = pytest.mark.acceptance

SCHEMA = "conveyor"


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def _names(versions: list[int]) -> list[str]:
    by_version = {m.version: f"{m.version:04d}_{m.name}" for m in known_migrations()}
    return [by_version[v] for v in versions]


def _migration_rows(url: str) -> list[int]:
    with psycopg.connect(url) as c:
        if c.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.schema_migration",)).fetchone() == (None,):
            return []
        return [r[0] for r in c.execute(f"SELECT version FROM {SCHEMA}.schema_migration ORDER BY version")]


def test_version(procs: Procs) -> None:
    expected = f"conveyor {metadata.version('conveyor')}\n"
    for option in ("--version", "-V"):
        result = procs.run(option)
        assert result.returncode == 0, describe(result)
        assert result.stdout == expected, describe(result)


def test_migrate_status_and_dry_run_apply_nothing(procs: Procs, empty_db_url: str) -> None:
    env = conveyor_env(empty_db_url)
    everything = [m.version for m in known_migrations()]

    # A database never migrated: everything pending, and no traceback about a missing table.
    status = procs.json("migrate", "--status", env=env)
    assert (status["schema"], status["version"], status["latest"]) == (SCHEMA, 0, everything[-1])
    assert [(m["version"], m["status"], m["applied"]) for m in status["migrations"]] == [
        (v, "pending", None) for v in everything
    ]
    assert [m["version"] for m in status["pending"]] == everything
    dry = procs.json("migrate", "--dry-run", env=env)
    assert [(m["version"], m["name"]) for m in dry["pending"]] == [(m.version, m.name) for m in known_migrations()]
    assert "migrations" not in dry
    shown = procs.run("migrate", "--dry-run", env=env)
    assert shown.returncode == 0, describe(shown)
    listed = [line.strip() for line in shown.stdout.splitlines() if line.startswith("  ")]
    assert listed == _names(everything), describe(shown)  # in the order migrate applies them
    assert _migration_rows(empty_db_url) == []

    # Migrated, then as if by an older Conveyor: its two newest migrations pending.
    assert procs.run("migrate", env=env).returncode == 0
    with psycopg.connect(empty_db_url) as c:
        newest = c.execute(
            f"DELETE FROM {SCHEMA}.schema_migration WHERE version > %s RETURNING *", (everything[-3],)
        ).fetchall()
    status = procs.json("migrate", "--status", env=env)
    assert status["version"] == everything[-3]
    assert [m["version"] for m in status["pending"]] == everything[-2:]
    assert all(m["applied"] for m in status["migrations"][:-2])
    assert [m["status"] for m in status["migrations"][-3:]] == ["applied", "pending", "pending"]
    table = procs.run("migrate", "--status", env=env)
    assert table.returncode == 0, describe(table)
    assert f"at version {everything[-3]} of {everything[-1]}: 2 pending" in table.stdout, describe(table)
    shown = procs.run("migrate", "--dry-run", env=env)
    assert [line.strip() for line in shown.stdout.splitlines() if line.startswith("  ")] == _names(everything[-2:])
    assert _migration_rows(empty_db_url) == everything[:-2]

    # Up to date again (their rows back: migrations are not applied twice): nothing
    # pending, which is what a script checks.
    with psycopg.connect(empty_db_url) as c, c.cursor() as cur:
        cur.executemany(f"INSERT INTO {SCHEMA}.schema_migration VALUES (%s, %s, %s, %s, %s)", newest)
    assert procs.json("migrate", "--dry-run", env=env)["pending"] == []
    assert "would apply nothing" in procs.run("migrate", "--dry-run", env=env).stdout


def test_migrate_status_refusals(procs: Procs, env: dict[str, str], db_url: str) -> None:
    both = procs.run("migrate", "--status", "--dry-run")
    assert both.returncode == 1, describe(both)
    assert both.stderr.startswith("error:"), describe(both)
    assert both.stderr.count("\n") == 1, describe(both)

    with psycopg.connect(db_url) as c:
        c.execute(f"INSERT INTO {SCHEMA}.schema_migration (version, name, checksum) VALUES (9999, 'future', 'x')")
    newer = procs.run("migrate", "--status")
    assert newer.returncode == 1, describe(newer)
    assert "newer than this Conveyor knows" in newer.stderr, describe(newer)
    assert "Traceback" not in newer.stderr, describe(newer)


def test_migrate_json(procs: Procs, empty_db_url: str) -> None:
    env = conveyor_env(empty_db_url)
    first = procs.json("migrate", env=env)
    assert [m["version"] for m in first["applied"]] == [m.version for m in known_migrations()]
    assert procs.json("migrate", env=env) == {"schema": SCHEMA, "applied": []}


def test_db_url_and_psql(procs: Procs, db_url: str, tmp_path: Path) -> None:
    printed = procs.run("db", "url")
    assert printed.returncode == 0, describe(printed)
    assert printed.stdout == db_url + "\n"

    # Conveyor's schema is on psql's search_path: the runbook's SQL runs as written.
    counted = procs.run("psql", "-At", "-c", "SELECT count(*) FROM schema_migration")
    assert counted.returncode == 0, describe(counted)
    assert counted.stdout == f"{len(known_migrations())}\n"

    # Without a psql on PATH, the embedded PostgreSQL's own.
    bare = conveyor_env(db_url, PATH=str(tmp_path))
    bundled = procs.run("psql", "-At", "-c", "SELECT 6 * 7", env=bare)
    assert bundled.returncode == 0, describe(bundled)
    assert bundled.stdout == "42\n"


def test_psql_keeps_the_password_out_of_its_argv(procs: Procs, db_url: str) -> None:
    # The test server trusts every connection, so any password is accepted (and ignored).
    url = f"{db_url} password=s3cret-pw"
    # psql's shell escape shows psql's own command line (its parent's) and environment.
    shell = r"""\! tr '\0' ' ' < /proc/$PPID/cmdline; echo; echo "pw=$PGPASSWORD" """
    result = procs.run("psql", "-c", shell, env=conveyor_env(url))
    assert result.returncode == 0, describe(result)
    argv, password = result.stdout.splitlines()[:2]
    assert "psql" in argv, describe(result)
    assert "s3cret-pw" not in argv, describe(result)
    assert password == "pw=s3cret-pw", describe(result)


def test_no_embedded_database_running(procs: Procs, tmp_path: Path) -> None:
    env = conveyor_env(None, CONVEYOR__EMBEDDED__DATA_DIR=tmp_path / "pgdata")
    for command in (["db", "url"], ["psql", "-c", "SELECT 1"], ["migrate", "--status"]):
        result = procs.run(*command, env=env)
        assert result.returncode == 1, describe(result)
        assert result.stdout == "", describe(result)
        assert result.stderr.count("\n") == 1, describe(result)  # one line, no traceback
        assert "is not running; start it with `conveyor up`" in result.stderr, describe(result)
