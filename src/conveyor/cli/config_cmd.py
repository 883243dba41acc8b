"""``conveyor config show``."""

from __future__ import annotations

import contextlib
from typing import Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, console, print_json, state
from conveyor.config import Settings, _flatten
from conveyor.config.keys import mask_secrets
from conveyor.domain.errors import DatabaseUnavailableError
from conveyor.service import embedded
from conveyor.worker.naming import default_worker_name

app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)

COMPUTED = "computed"

# A worker's default name holds its own pid, unknown until it starts.
PID_PLACEHOLDER = "<pid>"


def computed(settings: Settings) -> dict[str, Any]:
    """What the settings left unset (None) amount to at run time, by the same functions
    the services call: shown instead of ``None``. ``database.url`` only while the embedded
    PostgreSQL runs (its URL is read from its ``postmaster.pid``)."""
    values: dict[str, Any] = {
        "worker.name": default_worker_name(PID_PLACEHOLDER),
        "worker.prefetch": settings.worker.prefetched,
        "dead_letter.exchange": settings.dead_letter_exchange,
        "embedded.data_dir": str(embedded.data_dir(settings)),
    }
    values["database.prepared_statements"] = settings.database.prepare_threshold is not None
    if settings.database.url is None:
        with contextlib.suppress(DatabaseUnavailableError):
            values["database.url"] = embedded.find_running(settings)
    values["database.direct_url"] = values.get("database.url", settings.database.url)
    return values


def effective(settings: Settings, sources: dict[str, str]) -> dict[str, tuple[Any, str]]:
    """Every key -> (value, source); an unset key the runtime computes -> (its value, computed)."""
    values: dict[str, Any] = _flatten(settings.model_dump(by_alias=True, mode="json"))
    shown = {key: (value, sources.get(key, "default")) for key, value in values.items()}
    for key, value in computed(settings).items():
        if values.get(key) is None:
            shown[key] = (value, COMPUTED)
    for key in ("database.url", "database.direct_url", "message_queue.url"):
        value, source = shown[key]
        if value:
            shown[key] = (mask_secrets(str(value)), source)
    return shown


@app.command()
def show(as_json: bool = JsonOption) -> None:
    """Every effective setting and where it came from (default, file, environment, or
    computed: left unset, the value the services derive, e.g. the worker name host-<pid>)."""
    loaded = state.loaded
    shown = effective(loaded.settings, loaded.sources)
    if as_json:
        print_json({k: {"value": v, "source": source} for k, (v, source) in shown.items()})
        return
    table = Table("key", "value", "source")
    for key, (value, source) in shown.items():
        table.add_row(key, repr(value) if not isinstance(value, str) else value, source)
    console.print(table)
