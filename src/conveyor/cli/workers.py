"""``conveyor workers list|cordon|uncordon|drain``."""

from __future__ import annotations

from typing import Annotated, TypeAlias

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, age, console, print_json, state

app = typer.Typer(help="Inspect and manage workers.", no_args_is_help=True)


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
            w.status + (" (cordoned)" if w.cordoned else ""),
            f"{w.load}/{w.capacity}",
            ",".join(w.runtimes),
            age(w.heartbeat_age),
            w.host or "-",
            str(w.pid or "-"),
        )
    console.print(table)


Name: TypeAlias = Annotated[str, typer.Argument(help="Worker name")]


@app.command()
def cordon(name: Name) -> None:
    """Give the worker no new work; what it runs carries on."""
    with state.client() as client:
        client.cordon(name)
    console.print(f"worker {name} cordoned")


@app.command()
def uncordon(name: Name) -> None:
    """Let the worker take new work again."""
    with state.client() as client:
        client.cordon(name, cordoned=False)
    console.print(f"worker {name} uncordoned")


@app.command()
def drain(name: Name) -> None:
    """Cordon the worker and move its not-yet-started work to other workers."""
    with state.client() as client:
        moved = client.drain(name)
    console.print(f"worker {name} cordoned; {moved} scheduled execution(s) handed to other workers")
