"""Long-running commands: up, executor, worker, migrate."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from conveyor import embedded
from conveyor.app import exit_if_actions_linger, prepare_database, serve
from conveyor.cli.context import console, err_console, state
from conveyor.config import Settings
from conveyor.logs import configure

Imports = Annotated[list[str] | None, typer.Option("--import", "-i", help="Module whose actions to offer.")]


def _run(
    settings: Settings, url: str, *, executor: bool, worker: bool, imports: list[str], banner: bool = False
) -> None:
    configure(settings.log.level, settings.log.json_output)

    def ready(worker_name: str | None) -> None:
        if banner:
            err_console.print(
                f"[bold green]Conveyor is up[/] (worker {worker_name}). In another terminal:\n"
                "  conveyor run core.echo message=hello --wait\n"
                "  conveyor executions list\nPress Ctrl-C to stop."
            )

    asyncio.run(serve(settings, url, run_executor=executor, run_worker=worker, imports=imports, on_ready=ready))


def up(imports: Imports = None) -> None:
    """Run everything in one process: migrations, executor and worker. Without
    DATABASE_URL it starts the embedded PostgreSQL and stops it on exit."""
    settings = state.loaded.settings
    if settings.database.url:
        _run(settings, settings.database.url, executor=True, worker=True, imports=imports or [], banner=True)
        exit_if_actions_linger()
        return
    err_console.print(f"starting the embedded PostgreSQL in {embedded.data_dir(settings)} ...")
    with embedded.running_server(settings) as url:
        _run(settings, url, executor=True, worker=True, imports=imports or [], banner=True)
    exit_if_actions_linger()


def executor() -> None:
    """Run an executor (any number of replicas may run)."""
    settings = state.loaded.settings
    _run(settings, embedded.resolve_url(settings), executor=True, worker=False, imports=[])


def worker(
    name: Annotated[str | None, typer.Option(help="Unique worker name (default host-pid).")] = None,
    imports: Imports = None,
    concurrency: Annotated[int | None, typer.Option(help="Executions run at once.")] = None,
) -> None:
    """Run a worker offering the core pack plus the actions of --import modules."""
    settings = state.loaded.settings
    if name:
        settings.worker.name = name
    if concurrency:
        settings.worker.max_concurrent_tasks = concurrency
    _run(settings, embedded.resolve_url(settings), executor=False, worker=True, imports=imports or [])
    exit_if_actions_linger()


def migrate() -> None:
    """Apply pending migrations (safe to run from several processes at once)."""
    settings = state.loaded.settings
    applied = prepare_database(embedded.resolve_url(settings), settings.database.schema_name)
    if applied:
        for m in applied:
            console.print(f"applied {m.version:04d}_{m.name}")
    else:
        console.print(f"schema {settings.database.schema_name!r} is up to date")
