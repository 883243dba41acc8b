"""What every command needs: the loaded settings, the database URL, output helpers."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import datetime
from enum import Enum
from typing import Any

import typer
from rich.console import Console

from conveyor.config import LoadedSettings, load_settings
from conveyor.embedded import resolve_url
from conveyor.sdk import Client

# Tables keep their width when piped; errors are never wrapped mid-sentence.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True)


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
        return Client(resolve_url(settings), settings.database.schema_name)


state = State()


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
