"""Reaching the configured database: ``conveyor migrate --status|--dry-run`` (what is
applied, what is pending), ``conveyor db url`` and ``conveyor psql``. The URL is the one
every other command resolves: ``DATABASE_URL`` (or ``database.url``), else the embedded
PostgreSQL that a ``conveyor up`` of this user runs."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import psycopg
import typer
from rich.table import Table

from conveyor.cli.context import console, print_json, state, styled, when
from conveyor.domain.errors import ConveyorError
from conveyor.service import embedded
from conveyor.store.migrate import Migration, MigrationState, migration_states

app = typer.Typer(help="The configured database: its connection URL.", no_args_is_help=True)


# -- migrate --status | --dry-run -----------------------------------------------------------


def _name(migration: Migration) -> str:
    return f"{migration.version:04d}_{migration.name}"


def _brief(migration: Migration) -> dict[str, Any]:
    return {"version": migration.version, "name": migration.name}


def show_migrations(*, status: bool, as_json: bool) -> None:
    """``--status`` (every migration) or ``--dry-run`` (the pending ones, in the order
    ``migrate`` applies them); reads only."""
    settings = state.loaded.settings
    schema = settings.database.schema_name
    states = migration_states(embedded.resolve_direct_url(settings), schema)
    pending = [s.migration for s in states if s.applied is None]
    version = max((s.migration.version for s in states if s.applied is not None), default=0)
    latest = states[-1].migration.version if states else 0
    if as_json:
        data: dict[str, Any] = {
            "schema": schema,
            "version": version,
            "latest": latest,
            "pending": [_brief(m) for m in pending],
        }
        if status:
            data["migrations"] = [_entry(s) for s in states]
        print_json(data)
        return
    if status:
        _print_status(states, schema, version, latest, len(pending))
    elif pending:
        since = f"at version {version}" if version else "no migrations applied yet"
        console.print(f"schema {schema!r} ({since}): `conveyor migrate` would apply, in order:")
        for migration in pending:
            console.print(f"  {_name(migration)}")
        console.print("nothing was applied (dry run)")
    else:
        console.print(f"schema {schema!r} is up to date (version {version}): `conveyor migrate` would apply nothing")


def _entry(s: MigrationState) -> dict[str, Any]:
    return {**_brief(s.migration), "status": "pending" if s.applied is None else "applied", "applied": s.applied}


def _print_status(states: list[MigrationState], schema: str, version: int, latest: int, pending: int) -> None:
    table = Table("migration", "status", "applied")
    for s in states:
        if s.applied is None:
            table.add_row(_name(s.migration), styled("pending", "yellow"), "-")
        else:
            table.add_row(_name(s.migration), styled("applied", "green"), when(s.applied))
    console.print(table)
    if pending:
        console.print(f"schema {schema!r} is at version {version} of {latest}: {pending} pending (`conveyor migrate`)")
    else:
        console.print(f"schema {schema!r} is up to date (version {version})")


# -- db url, psql ---------------------------------------------------------------------------


@app.command()
def url() -> None:
    """Print the connection URL the configuration resolves to (database.direct_url when set:
    a psql session needs no pooler).

    For any PostgreSQL client: psql "$(conveyor db url)". It includes the password, if the
    URL has one. Without DATABASE_URL it is the embedded PostgreSQL's, which a `conveyor up`
    of this user must be running."""
    console.print(embedded.resolve_direct_url(state.loaded.settings), highlight=False, soft_wrap=True)


def psql(ctx: typer.Context) -> None:
    """Run psql on the configured database (the embedded one while `conveyor up` runs).

    Conveyor's schema comes first on psql's search_path. Arguments after `psql` go to psql
    (all but --help): conveyor psql -c 'SELECT count(*) FROM execution'. Uses the psql on
    PATH, else the one that comes with the embedded PostgreSQL."""
    settings = state.loaded.settings
    params = psycopg.conninfo.conninfo_to_dict(embedded.resolve_direct_url(settings))
    env = dict(os.environ)
    # The password goes through the environment, not argv, where `ps` shows it to anyone.
    password = params.pop("password", None)
    if password:
        env["PGPASSWORD"] = str(password)
    # The runbook's SQL names Conveyor's objects unqualified. An `options` in the URL
    # still wins: libpq reads PGOPTIONS only when the connection string has none.
    env["PGOPTIONS"] = f"-c search_path={settings.database.schema_name},public {env.get('PGOPTIONS', '')}".strip()
    binary = _psql_binary()
    argv = [binary, "--dbname", psycopg.conninfo.make_conninfo("", **params), *ctx.args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(binary, argv, env)
    except OSError as exc:
        raise ConveyorError(f"cannot run {binary}: {exc.strerror or exc}") from exc


def _psql_binary() -> str:
    """The user's psql (their version, their ~/.psqlrc), else the one that comes with the
    embedded PostgreSQL, so that a machine without a PostgreSQL client still has one."""
    found = shutil.which("psql") or embedded.bundled_psql()
    if found is None:
        raise ConveyorError(
            "psql is not installed (not on PATH): install the PostgreSQL client (e.g. apt install "
            "postgresql-client), or give another client the URL of `conveyor db url`"
        )
    return str(found)
