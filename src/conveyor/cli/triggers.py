"""``conveyor triggers register|list|get|delete``: the named sources of events (issue #13).
``register`` creates or updates a custom trigger with the JSON Schema its events' payloads
must satisfy; webhooks and schedules register their own triggers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, line, print_json, state, when
from conveyor.cli.run import parse_json
from conveyor.domain.documents import DocumentError
from conveyor.domain.errors import ConveyorError

app = typer.Typer(help="Register, list, show and delete triggers (the sources of events).", no_args_is_help=True)


def read_json_file(path: str, what: str) -> Any:
    """A JSON document from a file, or from standard input for ``-``; one-line errors."""
    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConveyorError(f"{what} {path}: cannot read it: {exc}") from None
    try:
        return parse_json(raw)
    except DocumentError as exc:
        raise ConveyorError(f"{what} {path}: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, and numbers JSON cannot carry
        raise ConveyorError(f"{what} {path}: not JSON: {exc}") from None


@app.command()
def register(
    name: Annotated[str, typer.Argument(help="Trigger name, e.g. deploys or github.push")],
    schema: Annotated[
        str | None, typer.Option("--schema", help="A JSON Schema file for the payloads ('-': standard input).")
    ] = None,
    description: Annotated[str | None, typer.Option(help="What its events mean.")] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Create a custom trigger, or update its payload schema and description."""
    payload_schema = read_json_file(schema, "--schema") if schema is not None else None
    with state.client() as client:
        created = client.register_trigger(name, payload_schema, description)
        trigger = client.trigger(name)
    if as_json:
        print_json({**trigger, "created_now": created})
    else:
        console.print(f"trigger {name} {'registered' if created else 'updated'}", highlight=False)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every trigger: its type, how many rules use it, its newest event."""
    with state.client() as client:
        rows = client.triggers()
    if as_json:
        print_json(rows)
        return
    table = Table("name", "type", "rules", "last event", "schema", "description")
    for r in rows:
        table.add_row(
            r["name"],
            r["type"],
            str(r["rules"]),
            when(r["last_event"]),
            "yes" if r["payload_schema"] is not None else "-",
            r["description"] or "",
        )
    console.print(table)


@app.command()
def get(name: Annotated[str, typer.Argument(help="Trigger name")], as_json: bool = JsonOption) -> None:
    """One trigger with its payload schema."""
    with state.client() as client:
        trigger = client.trigger(name)
    if as_json:
        print_json(trigger)
        return
    console.print(line((f"trigger {trigger['name']}", "bold"), f"  {trigger['type']}"))
    console.print(f"  description: {trigger['description'] or '-'}", highlight=False)
    schema = json.dumps(trigger["payload_schema"]) if trigger["payload_schema"] is not None else "(any JSON)"
    console.print(f"  payload schema: {schema}", highlight=False)
    console.print(
        f"  rules: {trigger['rules']}  last event: {when(trigger['last_event'])}"
        f"  created {when(trigger['created'])}  updated {when(trigger['updated'])}",
        highlight=False,
    )


@app.command()
def delete(name: Annotated[str, typer.Argument(help="Trigger name")], as_json: bool = JsonResultOption) -> None:
    """Delete a trigger; refused while rules, webhooks, schedules or its events use it."""
    with state.client() as client:
        client.delete_trigger(name)
    if as_json:
        print_json({"deleted": name})
    else:
        console.print(f"trigger {name} deleted", highlight=False)
