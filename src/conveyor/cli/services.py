"""Long-running commands: up, api, executor, worker, migrate."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Annotated

import typer

from conveyor.cli.context import JsonOption, console, err_console, line, print_json, state
from conveyor.cli.database import show_migrations
from conveyor.config import Settings
from conveyor.domain.errors import ConveyorError
from conveyor.ops.logs import configure
from conveyor.service import embedded
from conveyor.service.embedded_server import supervised

# The service (worker, executor, API) is imported by the commands that run it, not by
# every CLI call: each of the others starts faster (about 15% of its import time).
if TYPE_CHECKING:
    from conveyor.service.app import Started

Imports = Annotated[list[str] | None, typer.Option("--import", "-i", help="Module whose actions to offer.")]


def _run(
    settings: Settings,
    url: str,
    *,
    executor: bool,
    worker: bool,
    imports: list[str],
    api: bool = False,
    banner: bool = False,
) -> None:
    from conveyor.service.app import serve

    configure(settings.log.level, settings.log.json_output)

    def ready(started: Started) -> None:
        if not banner:
            return
        lines: list[str] = []
        if started.api_url:
            lines.append(f"  dashboard and API: {started.api_url}  (API docs: {started.api_url}/docs)")
        if started.admin_token:
            lines.append("  an admin token was created (shown once; it opens the dashboard):")
        lines.append("In another terminal:\n  conveyor run core.echo message=hello --wait\n  conveyor executions list")
        lines.append("Press Ctrl-C to stop.")
        err_console.print(line(("Conveyor is up", "bold green"), f" (worker {started.worker_name})."))
        err_console.print("\n".join(lines))
        if started.admin_token:
            print(started.admin_token, flush=True)  # alone on its line on stdout, for scripts

    asyncio.run(
        serve(
            settings,
            url,
            run_executor=executor,
            run_worker=worker,
            run_api=api,
            bootstrap_token=banner and api,
            imports=imports,
            on_ready=ready,
        )
    )


def up(imports: Imports = None) -> None:
    """Run everything in one process: migrations, executor, worker, the REST API and the
    dashboard (api.port, 8080; on its first start it prints their URL and an admin token).
    Without DATABASE_URL it starts the embedded PostgreSQL (or takes over the one a killed
    `up` left running), restarts it if it dies, and stops it on exit."""
    from conveyor.service.app import exit_if_actions_linger

    settings = state.loaded.settings
    if settings.database.url:
        _run(settings, settings.database.url, executor=True, worker=True, api=True, imports=imports or [], banner=True)
        exit_if_actions_linger()
        return
    configure(settings.log.level, settings.log.json_output)  # the supervisor logs from here on
    err_console.print(f"starting the embedded PostgreSQL in {embedded.data_dir(settings)} ...")
    # A database that keeps dying: stop, as a first Ctrl-C would (the services drain).
    with supervised(settings, on_give_up=lambda: os.kill(os.getpid(), signal.SIGTERM)) as server:
        _run(settings, server.url, executor=True, worker=True, api=True, imports=imports or [], banner=True)
    if server.gave_up:
        raise ConveyorError(server.gave_up)
    exit_if_actions_linger()


def api() -> None:
    """Serve the REST API and the dashboard (any number of API processes may run)."""
    settings = state.loaded.settings
    _run(settings, embedded.resolve_url(settings), executor=False, worker=False, api=True, imports=[])


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
    from conveyor.service.app import exit_if_actions_linger

    settings = state.loaded.settings
    if name:
        settings.worker.name = name
    if concurrency:
        settings.worker.max_concurrent_tasks = concurrency
    _run(settings, embedded.resolve_url(settings), executor=False, worker=True, imports=imports or [])
    exit_if_actions_linger()


def migrate(
    status: Annotated[
        bool, typer.Option("--status", help="List every migration, applied (when) or pending; apply nothing.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the migrations `migrate` would apply, in order; apply nothing.")
    ] = False,
    as_json: bool = JsonOption,
) -> None:
    """Apply pending migrations (safe to run from several processes at once).

    --status and --dry-run only read, and exit 0 whether or not migrations are pending: a
    script reads `pending` in their --json output (an empty list when up to date), e.g.
    conveyor migrate --dry-run --json | jq -e '.pending == []'."""
    if status and dry_run:
        raise ConveyorError("--status and --dry-run are alternatives: give one")
    if status or dry_run:
        show_migrations(status=status, as_json=as_json)
        return
    from conveyor.service.app import prepare_database

    settings = state.loaded.settings
    applied = prepare_database(embedded.resolve_direct_url(settings), settings.database.schema_name)
    if as_json:
        print_json(
            {
                "schema": settings.database.schema_name,
                "applied": [{"version": m.version, "name": m.name} for m in applied],
            }
        )
        return
    if applied:
        for m in applied:
            console.print(f"applied {m.version:04d}_{m.name}")
    else:
        console.print(f"schema {settings.database.schema_name!r} is up to date")
