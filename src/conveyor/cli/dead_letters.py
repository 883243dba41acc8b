"""``conveyor dead-letters list|show|replay|purge``: the ``dead_letter`` table.

Every dead-lettered message (both transports) is recorded there by the executors'
handler (``executor/dead_letters.py``) and resolved; these commands let an operator
look at the records, publish a message again, and delete records.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from conveyor.cli.context import (
    JsonOption,
    JsonResultOption,
    confirm,
    console,
    err_console,
    line,
    print_json,
    state,
    styled,
    when,
)
from conveyor.domain.dead_letters import DeadLetterReason, Resolution
from conveyor.domain.delays import DurationTooLong
from conveyor.domain.errors import ConveyorError
from conveyor.domain.retention import RetentionError, parse_age
from conveyor.verbs.dead_letters import Outcome, PurgeFilters

app = typer.Typer(help="Inspect, replay and purge dead-lettered messages.", no_args_is_help=True)

REPLAYED_BY = "cli"


Reason = DeadLetterReason  # the vocabulary is defined once, in domain/dead_letters.py


# -- durations ----------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h`` or ``1d`` (fractions allowed: ``1.5h``):
    the same ages a purge takes (domain.retention.parse_age), said as a duration here."""
    try:
        return parse_age(text)
    except DurationTooLong as exc:
        raise typer.BadParameter(str(exc)) from None
    except RetentionError:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give seconds (90) or a number with s, m, h or d (15m)"
        ) from None


# -- shared options -----------------------------------------------------------------------

ReasonOption = Annotated[Reason | None, typer.Option(help="Only this reason.")]
ResolutionOption = Annotated[
    Resolution | None, typer.Option(help="Only this resolution ('pending': not resolved yet).")
]
ExecutionOption = Annotated[
    int | None, typer.Option("--execution", metavar="ID", help="Only dead letters about this execution.")
]
QueueOption = Annotated[str | None, typer.Option("--queue", metavar="NAME", help="Only this queue.")]
SinceOption = Annotated[
    float | None,
    typer.Option(parser=parse_duration, metavar="DURATION", help="Only first seen within this long (90, 15m, 2h, 1d)."),
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@dataclass(frozen=True, slots=True)
class Filters:
    reason: Reason | None = None
    resolution: Resolution | None = None
    execution: int | None = None
    queue: str | None = None
    since: float | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.reason, self.resolution, self.execution, self.queue, self.since))

    def params(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value if self.reason else None,
            "resolution": self.resolution.value if self.resolution else None,
            "execution": self.execution,
            "queue": self.queue,
            "since": self.since,
        }


def _resolution(value: str | None) -> str:
    return value or "pending"


_RESOLUTION_STYLE = {
    "pending": "yellow",
    "rescheduled": "green",
    "failed": "red",
    "stale": "dim",
    "invalid": "red",
    "replayed": "cyan",
}


def _styled(resolution: str | None) -> Text:
    text = _resolution(resolution)
    return styled(text, _RESOLUTION_STYLE.get(text, "white"))


# -- list -----------------------------------------------------------------------------------


@app.command("list")
def list_(
    reason: ReasonOption = None,
    resolution: ResolutionOption = None,
    execution: ExecutionOption = None,
    queue: QueueOption = None,
    since: SinceOption = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: bool = JsonOption,
) -> None:
    """Newest dead letters first."""
    filters = Filters(reason, resolution, execution, queue, since)
    with state.client() as client:
        rows = client.dead_letters(**filters.params(), limit=limit)
    if as_json:
        print_json(rows)
        return
    table = Table(
        "id",
        "first seen",
        "reason",
        "resolution",
        "queue",
        "routing key",
        "execution",
        "attempt",
        "deliveries",
        "detail",
    )
    for r in rows:
        table.add_row(
            str(r["id"]),
            when(r["first_seen"]),
            r["reason"],
            _styled(r["resolution"]),
            r["queue"],
            r["routing_key"] or "-",
            _text(r["execution"]),
            _text(r["attempt"]),
            str(r["deliveries"]),
            r["detail"] or r["error"] or "",
        )
    console.print(table)


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


# -- show -----------------------------------------------------------------------------------


@app.command()
def show(
    dead_letter_id: Annotated[int, typer.Argument(metavar="ID", help="Dead letter id")], as_json: bool = JsonOption
) -> None:
    """One dead letter: every column, with the message body (payload) and headers."""
    with state.client() as client:
        row = client.dead_letter(dead_letter_id)
    if as_json:
        print_json(row)
        return
    console.print(
        line(
            (f"dead letter {row['id']}", "bold"),
            f"  {row['reason']}  ",
            _styled(row["resolution"]),
            f"  ({row['transport']} transport)",
        )
    )
    for key, value in row.items():
        if key in ("payload", "headers"):
            continue
        if key == "resolution":
            value = _resolution(value)
        elif key in ("first_seen", "last_seen", "resolved") and value is not None:
            value = f"{when(value)}  ({value.isoformat()})"
        console.print(f"  {key:<13} {_text(value)}", highlight=False)
    for key in ("payload", "headers"):
        console.print(f"  {key}:", highlight=False)
        text = textwrap.indent(json.dumps(row[key], indent=2, sort_keys=True), "    ")
        console.print(text, highlight=False)


# -- replay -----------------------------------------------------------------------------------


def _report(outcome: Outcome, quiet: bool) -> None:
    """One letter's outcome as it comes; ``quiet``: errors only (stdout is for --json's
    document)."""
    if outcome.error:
        err_console.print(line(("error:", "red"), f" {outcome.error}"), highlight=False)
    elif quiet:
        return
    elif outcome.skipped:
        console.print(f"dead letter {outcome.id}: skipped ({outcome.skipped})", highlight=False)
    else:
        console.print(f"dead letter {outcome.id}: replayed to {outcome.routing_key}", highlight=False)


def _summary(ids: list[int], shown: int = 10) -> str:
    listed = ", ".join(str(i) for i in ids[:shown])
    return listed + (", …" if len(ids) > shown else "")


@app.command()
def replay(
    ids: Annotated[list[int] | None, typer.Argument(metavar="ID", help="Dead letter ids.")] = None,
    reason: ReasonOption = None,
    resolution: ResolutionOption = None,
    execution: ExecutionOption = None,
    queue: QueueOption = None,
    since: SinceOption = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="With filters: replay at most this many.")] = 1000,
    yes: YesOption = False,
    as_json: bool = JsonResultOption,
) -> None:
    """Publish dead-lettered messages again to where they were going, and mark them
    replayed. Give ids, or filters (asks for confirmation unless --yes); with filters,
    letters already replayed are left out unless --resolution replayed. --json: one
    {"id", "outcome" (replayed, skipped, error), "routing_key", "skipped", "error"} per letter."""
    filters = Filters(reason, resolution, execution, queue, since)
    if ids and filters.given:
        raise ConveyorError("give dead letter ids or filters, not both")
    if not ids and not filters.given:
        raise ConveyorError(
            "replay needs dead letter ids or at least one filter "
            "(--reason, --resolution, --execution, --queue, --since)"
        )
    with state.client() as client:
        if ids:
            selected = list(dict.fromkeys(ids))
        else:
            include_replayed = resolution is Resolution.REPLAYED
            selected = client.dead_letter_ids(**filters.params(), include_replayed=include_replayed, limit=limit + 1)
            if not selected:
                if as_json:
                    print_json([])
                else:
                    console.print("no dead letters match")
                return
            more = len(selected) > limit
            selected = selected[:limit]
            if more:
                note = f"more than {limit} dead letters match: the oldest {limit} are selected (raise --limit)"
                (err_console if as_json else console).print(note)
            if not yes and not confirm(f"Replay {len(selected)} dead letter(s) ({_summary(selected)})?", err=as_json):
                raise ConveyorError("not confirmed; nothing replayed (--yes skips the question)")
        # Each letter in its own transaction: what was replayed before an error stays replayed.
        skip_replayed = not ids and resolution is not Resolution.REPLAYED
        outcomes = client.replay_dead_letters(
            selected, by=REPLAYED_BY, skip_replayed=skip_replayed, report=lambda o: _report(o, as_json)
        )
    if as_json:  # printed whatever happened: what was replayed before an error was replayed
        print_json([{**dataclasses.asdict(o), "outcome": _outcome(o)} for o in outcomes])
    if any(o.error for o in outcomes):
        raise typer.Exit(1)


def _outcome(outcome: Outcome) -> str:
    return "error" if outcome.error else "skipped" if outcome.skipped else "replayed"


# -- purge -----------------------------------------------------------------------------------


@app.command()
def purge(
    reason: ReasonOption = None,
    resolution: ResolutionOption = None,
    execution: ExecutionOption = None,
    queue: QueueOption = None,
    older_than: Annotated[
        float | None,
        typer.Option(
            parser=parse_duration, metavar="DURATION", help="Only first seen longer ago than this (90, 15m, 2h, 1d)."
        ),
    ] = None,
    include_pending: Annotated[bool, typer.Option(help="Also delete letters not resolved yet.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="No filter: every (resolved) dead letter.")] = False,
    yes: YesOption = False,
    as_json: bool = JsonResultOption,
) -> None:
    """Delete dead-letter records: resolved ones only unless --include-pending. Needs
    a filter or --all; asks for confirmation unless --yes. --json: {"matched": N, "purged": N}."""
    given = Filters(reason, resolution, execution, queue).params()
    del given["since"]
    filters = PurgeFilters(**given, older_than=older_than, include_pending=include_pending)
    if not filters.given and not all_:
        raise ConveyorError(
            "purge needs at least one filter (--reason, --resolution, --execution, --queue, --older-than) or --all"
        )
    if resolution is Resolution.PENDING and not include_pending:
        raise ConveyorError("--resolution pending selects unresolved dead letters: add --include-pending to purge them")
    with state.client() as client:
        count = client.purgeable_dead_letters(filters)
        deleted = 0
        if count > 0:
            what = "dead letter(s)" if include_pending else "resolved dead letter(s)"
            if not yes and not confirm(f"Delete {count} {what}?", err=as_json):
                raise ConveyorError("not confirmed; nothing purged (--yes skips the question)")
            deleted = client.purge_dead_letters(filters)
    if as_json:
        print_json({"matched": count, "purged": deleted})
    elif count == 0:
        console.print("no dead letters to purge")
    else:
        console.print(f"purged {deleted} dead letter(s)")
