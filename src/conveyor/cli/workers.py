"""``conveyor workers list|cordon|uncordon|drain``."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, TypeAlias

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, age, console, print_json, state
from conveyor.domain.errors import ConveyorError
from conveyor.domain.models import WorkerInfo
from conveyor.sdk import Client

app = typer.Typer(help="Inspect and manage workers.", no_args_is_help=True)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every worker with its state (an inactive one: why, and since when), load and heartbeat age
    (database clock)."""
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
            _state(w),
            f"{w.load}/{w.capacity}",
            ",".join(w.runtimes),
            age(w.heartbeat_age),
            w.host or "-",
            str(w.pid or "-"),
        )
    console.print(table)


def _state(w: WorkerInfo) -> str:
    """``active (cordoned)``, or why and how long ago an inactive one went inactive."""
    text = w.status + (" (cordoned)" if w.cordoned else "")
    if w.inactive_reason is not None:
        text += f": {w.inactive_reason}, {age(w.inactive_age)} ago"
    return text


Name: TypeAlias = Annotated[str, typer.Argument(help="Worker name")]


def _worker(client: Client, name: str, **extra: Any) -> dict[str, Any]:
    """The worker as ``workers list --json`` shows it, with ``extra`` keys about the change."""
    row = next((w for w in client.workers() if w.name == name), None)
    if row is None:  # deleted since the command changed it
        raise ConveyorError(f"no worker named {name!r} (see `conveyor workers list`)")
    return {**dataclasses.asdict(row), **extra}


@app.command()
def cordon(name: Name, as_json: bool = JsonResultOption) -> None:
    """Give the worker no new work; what it runs carries on."""
    with state.client() as client:
        client.cordon(name)
        if as_json:
            print_json(_worker(client, name))
            return
    console.print(f"worker {name} cordoned")


@app.command()
def uncordon(name: Name, as_json: bool = JsonResultOption) -> None:
    """Let the worker take new work again."""
    with state.client() as client:
        client.cordon(name, cordoned=False)
        if as_json:
            print_json(_worker(client, name))
            return
    console.print(f"worker {name} uncordoned")


@app.command()
def drain(name: Name, as_json: bool = JsonResultOption) -> None:
    """Cordon the worker and move its not-yet-started work to other workers."""
    with state.client() as client:
        moved = client.drain(name)
        if as_json:
            print_json(_worker(client, name, handed_back=moved))
            return
    console.print(f"worker {name} cordoned; {moved} scheduled execution(s) handed to other workers")
