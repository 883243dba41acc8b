"""``conveyor executions purge``: delete finished executions older than an age, through
``purge_executions`` (migration 0024) -- the executors' retention duty's verb, through the
client -- in batches, each its own short transaction, with a progress bar."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from conveyor.cli.context import JsonResultOption, confirm, console, print_json, state
from conveyor.domain.errors import ConveyorError
from conveyor.domain.retention import FINISHED, check_statuses, parse_age
from conveyor.sdk import Client


def purge(
    older_than: Annotated[
        str,
        typer.Option("--older-than", metavar="AGE", help="Finished longer ago than this: 90, 15m, 12h, 30d, 2w."),
    ],
    status: Annotated[
        list[str] | None,
        typer.Option("--status", metavar="STATUS", help=f"Only this status (repeatable): {', '.join(FINISHED)}."),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=100_000, help="Top-level executions per transaction.")] = 1000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say how many would go; delete nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: bool = JsonResultOption,
) -> None:
    """Delete finished executions (with their attempts, workflow children and state, idempotency
    keys, inquiries, dead letters, outbox rows and enforcements) older than --older-than.
    Unfinished ones, and trees a live workflow or an unresolved dead letter still refers to,
    stay. Asks for confirmation unless --yes. --json: {"matched": N, "purged": N} (purged 0
    with --dry-run), and no progress bar."""
    seconds = parse_age(older_than)
    statuses = check_statuses(status) if status else None
    what = f"{'/'.join(statuses) if statuses else 'finished'} executions older than {older_than}"
    with state.client() as client:
        counting = "counting (a large backlog takes a while: ~30 s for 7 M)"
        with contextlib.nullcontext() if as_json else console.status(counting):
            count = client.purgeable(seconds, statuses)
        if as_json and (count == 0 or dry_run):
            print_json({"matched": count, "purged": 0})
            return
        if count == 0:
            console.print(f"no {what} to purge", highlight=False)
            return
        if dry_run:
            console.print(f"would purge {count} {what} (workflow children go with them)", highlight=False)
            return
        if not yes and not confirm(f"Delete {count} {what} (and their workflow children)?", err=as_json):
            raise ConveyorError("not confirmed; nothing purged (--yes skips the question)")
        purged = _run(client, seconds, statuses, batch_size, count, quiet=as_json)
    if as_json:
        print_json({"matched": count, "purged": purged})
        return
    console.print(f"purged {purged} execution(s)", highlight=False)


def _run(client: Client, seconds: float, statuses: list[str] | None, batch: int, count: int, *, quiet: bool) -> int:
    """Batches (each its own transaction) until one deletes nothing; the bar counts
    executions deleted (children included, so its total grows when workflows had children)."""
    done = 0
    columns = (TextColumn("purging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=quiet) as progress:
        task = progress.add_task("purge", total=count)
        while True:
            purged = client.purge(seconds, statuses, batch=batch)
            if purged == 0:
                break
            done += purged
            progress.update(task, completed=done, total=max(count, done))
        progress.update(task, total=done)
    return done
