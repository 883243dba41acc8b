"""``conveyor workers list``."""

from __future__ import annotations

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, age, console, print_json, state

app = typer.Typer(help="Inspect workers.", no_args_is_help=True)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every worker with its state, load and heartbeat age (database clock)."""
    with state.client() as client:
        rows = client.workers()
    if as_json:
        print_json(rows)
        return
    table = Table("id", "name", "status", "load", "runtimes", "heartbeat age", "host", "pid")
    for w in rows:
        table.add_row(
            str(w.id),
            w.name,
            w.status,
            f"{w.load}/{w.capacity}",
            ",".join(w.runtimes),
            age(w.heartbeat_age),
            w.host or "-",
            str(w.pid or "-"),
        )
    console.print(table)
