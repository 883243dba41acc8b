"""``conveyor executions purge``: delete finished executions older than an age, through
``purge_executions`` (migration 0024) -- the executors' retention duty's SQL function --
in batches, each its own short transaction, with a progress bar."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Annotated, Any

import psycopg
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from conveyor.cli.context import JsonResultOption, confirm, console, print_json, sql_session
from conveyor.domain.errors import ConveyorError
from conveyor.domain.retention import FINISHED, RetentionError, check_statuses, parse_age
from conveyor.store.db import Row
from conveyor.store.queries import Q


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
    params = {"older_than": seconds, "statuses": statuses, "batch": batch_size}
    with sql_session() as conn:
        try:
            counting = "counting (a large backlog takes a while: ~30 s for 7 M)"
            with contextlib.nullcontext() if as_json else console.status(counting):
                row = conn.execute(Q["purgeable_executions"], params).fetchone()
            count = int(row["count"]) if row else 0
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
            purged = _run(conn, params, count, quiet=as_json)
        except psycopg.errors.InvalidParameterValue as exc:  # the function's own checks
            raise RetentionError(exc.diag.message_primary or str(exc)) from None
    if as_json:
        print_json({"matched": count, "purged": purged})
        return
    console.print(f"purged {purged} execution(s)", highlight=False)


def _run(conn: psycopg.Connection[Row], params: Mapping[str, Any], count: int, *, quiet: bool) -> int:
    """Batches until one deletes nothing; the bar counts executions deleted (children
    included, so its total grows when workflows had children)."""
    done = 0
    columns = (TextColumn("purging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=quiet) as progress:
        task = progress.add_task("purge", total=count)
        while True:
            row = conn.execute(Q["purge_executions"], params).fetchone()
            purged = int(row["purged"]) if row else 0
            if purged == 0:
                break
            done += purged
            progress.update(task, completed=done, total=max(count, done))
        progress.update(task, total=done)
    return done
