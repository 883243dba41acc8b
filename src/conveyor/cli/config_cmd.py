"""``conveyor config show``."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, console, print_json, state
from conveyor.config import _flatten
from conveyor.config_keys import mask_secrets

app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)


@app.command()
def show(as_json: bool = JsonOption) -> None:
    """Every effective setting and where it came from (default, file, environment)."""
    loaded = state.loaded
    values: dict[str, Any] = _flatten(loaded.settings.model_dump(by_alias=True, mode="json"))
    for key in ("database.url", "message_queue.url"):
        if values.get(key):
            values[key] = mask_secrets(str(values[key]))
    if as_json:
        print_json({k: {"value": v, "source": loaded.sources.get(k, "default")} for k, v in values.items()})
        return
    table = Table("key", "value", "source")
    for key, value in values.items():
        table.add_row(key, repr(value) if not isinstance(value, str) else value, loaded.sources.get(key, "default"))
    console.print(table)
