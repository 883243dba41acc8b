"""Entry point: global options, sub-commands, and errors shown without tracebacks."""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Annotated

import psycopg
import typer

import conveyor
from conveyor.cli import (
    actions,
    config_cmd,
    database,
    dead_letters,
    events,
    executions,
    inquiries,
    policies,
    rules,
    run,
    schedules,
    services,
    tokens,
    triggers,
    webhooks,
    workers,
    workflows,
)
from conveyor.cli.context import MISSING_SCHEMA, console, err_console, line, schema_problem, state
from conveyor.domain.errors import ConveyorError
from conveyor.store.db import pooler_hint, rolled_back

app = typer.Typer(
    name="conveyor",
    help="Conveyor: run actions on a fleet of workers; nothing stuck, lost or silently run twice.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def package_version() -> str:
    try:
        return metadata.version("conveyor")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return conveyor.__version__


def _print_version(value: bool) -> None:
    if value:
        console.print(f"conveyor {package_version()}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    config: Annotated[
        str | None, typer.Option("--config", "-c", envvar="CONVEYOR_CONFIG", help="YAML configuration file.")
    ] = None,
    version: Annotated[
        bool,
        # Eager: answered before the configuration is read or a sub-command is required.
        typer.Option("--version", "-V", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    state.config_file = config


app.command()(services.up)
app.command()(services.api)
app.command()(services.executor)
app.command()(services.worker)
app.command()(services.migrate)
# Everything after `psql` is psql's, options included (`conveyor psql -c 'SELECT 1'`).
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(database.psql)
app.add_typer(database.app, name="db")
app.command()(run.run)
app.add_typer(executions.app, name="executions")
app.add_typer(workers.app, name="workers")
app.add_typer(actions.app, name="actions")
app.add_typer(config_cmd.app, name="config")
app.add_typer(dead_letters.app, name="dead-letters")
app.add_typer(policies.app, name="policies")
app.add_typer(tokens.app, name="tokens")
app.add_typer(workflows.app, name="workflows")
app.add_typer(inquiries.app, name="inquiries")
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(rules.app, name="rules")
app.add_typer(schedules.app, name="schedules")
app.add_typer(triggers.app, name="triggers")  # issue #13
app.add_typer(events.app, name="events")
app.add_typer(events.enforcements, name="enforcements")


def _user_facing(exc: BaseException) -> str | None:
    """The message for an error a user can act on, looking inside task-group errors."""
    if isinstance(exc, ConveyorError):
        return str(exc)
    if isinstance(exc, MISSING_SCHEMA):
        return schema_problem()
    if isinstance(exc, psycopg.OperationalError) and rolled_back(exc):  # the database is up: not an outage
        why = exc.diag.message_primary or exc.sqlstate
        return f"the database rolled this back ({why}); nothing was done: run it again"
    if isinstance(exc, psycopg.OperationalError):
        return f"cannot reach the database: {str(exc).strip()}{pooler_hint(exc)}"
    if isinstance(exc, psycopg.DataError):
        # A value a door's own checks let through and PostgreSQL refused (the doors refuse
        # NUL and lone surrogates themselves: domain.storable): one line, as the API's 422.
        detail = f" ({exc.diag.message_detail})" if exc.diag.message_detail else ""
        first = (exc.diag.message_primary or str(exc)).splitlines()[0]
        return f"invalid value: {first}{detail}"
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            message = _user_facing(inner)
            if message:
                return message
    return None


def main() -> None:
    try:
        app()
    except (ConveyorError, psycopg.OperationalError, psycopg.DataError, *MISSING_SCHEMA, BaseExceptionGroup) as exc:
        message = _user_facing(exc)
        if message is None:
            raise
        print_error(message)
        sys.exit(1)


def print_error(message: str) -> None:
    """One line on stderr, the message as it is (it may quote "[a-z]" from a schema)."""
    err_console.print(line(("error:", "red"), f" {message}"), highlight=False)
