"""``conveyor actions list|get``."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, console, line, print_json, state

app = typer.Typer(help="Inspect registered actions.", no_args_is_help=True)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Actions that workers have registered."""
    with state.client() as client:
        rows = client.actions()
    if as_json:
        print_json(rows)
        return
    table = Table("ref", "runner", "runtime", "description")
    for a in rows:
        table.add_row(
            a["ref"], a["runner_type"], a["runtime"], a["description"].splitlines()[0] if a["description"] else ""
        )
    console.print(table)


@app.command()
def get(ref: Annotated[str, typer.Argument(help="Action ref")], as_json: bool = JsonOption) -> None:
    """One action with its parameter schema."""
    with state.client() as client:
        row = client.action(ref)
    if as_json:
        print_json(row)
        return
    console.print(line((row["ref"], "bold"), f"  ({row['runner_type']}, runtime {row['runtime']})"))
    if row["description"]:
        console.print(row["description"])
    console.print(json.dumps(row["parameters_schema"], indent=2), highlight=False)
