"""What every command needs: the loaded settings, the database URL, output helpers."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import sys
from datetime import datetime
from enum import Enum
from typing import Any

import psycopg
import typer
from rich.text import Text

from conveyor.cli.terminal import SafeConsole, visible
from conveyor.config import LoadedSettings, load_settings
from conveyor.domain.errors import SchemaTooNewError
from conveyor.sdk import Client
from conveyor.service.embedded import resolve_direct_url
from conveyor.store.migrate import check_version, known_migrations

# Tables keep their width when piped; errors are never wrapped mid-sentence.
# Neither console interprets markup nor emoji codes: what they print is user data
# (action refs, parameters, results, error messages quoting schemas) that may hold
# "[/x]" or ":smile:". Styling is explicit, with ``Text`` (see ``styled``).
# On a terminal, control characters in what they print are shown as \xNN (SafeConsole): user
# data must not drive the operator's terminal.
console = SafeConsole(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False)
err_console = SafeConsole(stderr=True, soft_wrap=True, markup=False, emoji=False)


class State:
    config_file: str | None = None
    _loaded: LoadedSettings | None = None

    @property
    def loaded(self) -> LoadedSettings:
        if self._loaded is None:
            self._loaded = load_settings(self.config_file)
        return self._loaded

    def client(self) -> Client:
        settings = self.loaded.settings
        return Client(
            resolve_direct_url(settings),
            settings.database.schema_name,
            user=cli_user(),
            document_limits=settings.documents.limits(),
            verb_retries=settings.database.verb_retries,
        )


state = State()


def cli_user() -> str:
    """Who runs the CLI: CONVEYOR_USER, else the operating-system user. Recorded as the
    requester of what ``conveyor run`` requests and as the responder of
    ``conveyor inquiries respond`` (an inquiry with forbid_requester tells them apart)."""
    try:
        return os.environ.get("CONVEYOR_USER") or getpass.getuser()
    except (OSError, KeyError):  # no user name for this uid (some containers)
        return "cli"


# What a query against a database that lacks (part of) the schema fails with.
MISSING_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.InvalidSchemaName,
)


def schema_problem() -> str | None:
    """Why the configured database cannot serve this Conveyor, when a query found a table
    (function, column) missing; ``None`` when its schema is up to date (then it is a bug)."""
    settings = state.loaded.settings
    schema = settings.database.schema_name
    try:
        version = check_version(resolve_direct_url(settings), schema)
    except SchemaTooNewError as exc:
        return str(exc)
    except psycopg.Error:
        return None
    newest = known_migrations()[-1].version
    if version == 0:
        return f"the database has no Conveyor schema {schema!r} (it was never migrated): run `conveyor migrate` first"
    if version < newest:
        return (
            f"schema {schema!r} is at version {version}, this Conveyor needs {newest}: "
            "run `conveyor migrate` with this version first"
        )
    return None


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, indent=2) + "\n")


def _shown(text: str) -> str:
    # Escaped when built, not only when printed (SafeConsole does both): a table measures its
    # cells' Text before printing them, and must measure what will be shown.
    return visible(text) if console.is_terminal or err_console.is_terminal else text


def styled(text: str, style: str) -> Text:
    """``text`` in ``style``, taken literally (never parsed as markup)."""
    return Text(_shown(text), style=style)


def line(*parts: str | Text | tuple[str, str]) -> Text:
    """One line from literal pieces: plain strings, ``Text``, or ``(text, style)``."""
    return Text.assemble(
        *(_shown(p) if isinstance(p, str) else (_shown(p[0]), p[1]) if isinstance(p, tuple) else p for p in parts)
    )


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
# Mutating commands: stdout then holds one JSON document and nothing else (docs: README, "--json").
JsonResultOption = typer.Option(False, "--json", help="Print what was done as JSON (nothing else on stdout).")


def confirm(question: str, *, err: bool = False) -> bool:
    """Ask yes/no (default no); end of input or Ctrl-C is a no. ``err``: ask on stderr,
    for a command whose stdout is a JSON document (``--json``). Not typer.confirm(err=True):
    click writes the space after the question to stdout all the same."""
    if not err:
        try:
            return typer.confirm(question, default=False)
        except typer.Abort:
            return False
    try:
        # Console.input parses markup unless told not to: "[y/N]" would vanish.
        answer = err_console.input(f"{question} [y/N]: ", markup=False, emoji=False)
        return answer.strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        err_console.print()  # end the question's line: what follows starts on its own
        return False
