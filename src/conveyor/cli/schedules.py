"""``conveyor schedules create|list|get|pause|resume|fire|backfill|delete`` (issue #13).

    conveyor schedules create nightly --cron "30 2 * * *" --timezone Europe/Paris ops.backup full=true
    conveyor schedules create tick --interval 30s core.echo message=tick --overlap skip
    conveyor schedules get nightly        # next fire times, recent slots and their executions

Without an ACTION the schedule emits events on a trigger of its name (for rules)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, line, print_json, state, styled, when
from conveyor.cli.run import parse_parameters
from conveyor.domain.errors import ConveyorError

app = typer.Typer(help="Cron, interval and one-time schedules: each slot fires exactly once.", no_args_is_help=True)

_STYLE = {
    "requested": "green",
    "emitted": "green",
    "skipped": "yellow",
    "missed": "red",
    "buffered": "cyan",
    "request_error": "red",
}
Name = Annotated[str, typer.Argument(help="Schedule name")]


class Catchup(StrEnum):
    skip = "skip"
    latest = "latest"
    all = "all"


class Overlap(StrEnum):
    allow = "allow"
    skip = "skip"
    buffer_one = "buffer_one"
    cancel_previous = "cancel_previous"


@app.command()
def create(
    name: Name,
    action: Annotated[str | None, typer.Argument(help="Action ref (none: emit events on a trigger of NAME)")] = None,
    parameters: Annotated[list[str] | None, typer.Argument(help="key=value pairs")] = None,
    cron: Annotated[str | None, typer.Option("--cron", help="5 fields, or 6 with seconds first")] = None,
    interval: Annotated[str | None, typer.Option("--interval", help="e.g. 30s, 5m, 1h30m")] = None,
    at: Annotated[str | None, typer.Option("--at", help="Once, at this ISO 8601 time")] = None,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA time zone the cron is read in")] = "UTC",
    catchup: Annotated[Catchup, typer.Option("--catchup", help="After an outage")] = Catchup.latest,
    catchup_window: Annotated[str, typer.Option("--catchup-window", help="How far back to catch up")] = "1h",
    overlap: Annotated[Overlap, typer.Option("--overlap", help="While the previous run goes on")] = Overlap.allow,
    starts: Annotated[str | None, typer.Option("--starts", help="No slot before (ISO 8601)")] = None,
    ends: Annotated[str | None, typer.Option("--ends", help="No slot after (ISO 8601)")] = None,
    description: Annotated[str | None, typer.Option("--description")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a schedule of that name")] = False,
    as_json: bool = JsonResultOption,
) -> None:
    """Create a schedule: exactly one of --cron, --interval or --at."""
    if sum(x is not None for x in (cron, interval, at)) != 1:
        raise ConveyorError("give exactly one of --cron, --interval or --at")
    with state.client() as client:
        params: dict[str, Any] = {}
        if action is not None:
            params = parse_parameters(parameters or [], client.action(action)["parameters_schema"])
        elif parameters:
            raise ConveyorError("parameters need an ACTION")
        made = client.create_schedule(
            name,
            replace=replace,
            cron=cron,
            every=interval,
            at=at,
            timezone=timezone,
            action=action,
            parameters=params,
            catchup=catchup.value,
            catchup_window=catchup_window,
            overlap=overlap.value,
            starts=starts,
            ends=ends,
            description=description,
        )
    if as_json:
        print_json(made)
        return
    console.print(f"schedule {name} created; next fire {_next(made)}", highlight=False)


def _next(s: dict[str, Any]) -> str:
    if s["paused"]:
        return "(paused)"
    return when(s["next_fire_times"][0]) if s["next_fire_times"] else "(none left)"


def _spec(s: dict[str, Any]) -> str:
    if s["kind"] == "cron":
        return f"cron {s['cron']} {s['timezone']}"
    if s["kind"] == "interval":
        return f"every {s['every']:g}s"
    return f"at {when(s['at'])}"


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every schedule with its next fire time."""
    with state.client() as client:
        rows = client.schedules()
    if as_json:
        print_json(rows)
        return
    table = Table("name", "when", "does", "catch-up", "overlap", "next fire")
    for s in rows:
        table.add_row(
            s["name"],
            _spec(s),
            s["action_ref"] or f"event on {s['trigger']}",
            f"{s['catchup']} {s['catchup_window']:g}s",
            s["overlap"],
            _next(s),
        )
    console.print(table)


@app.command()
def get(
    name: Name,
    count: Annotated[int, typer.Option("--next", min=0, max=100, help="Next fire times to show")] = 5,
    slots: Annotated[int, typer.Option("--slots", min=0, max=1000, help="Recent slots to show")] = 20,
    as_json: bool = JsonOption,
) -> None:
    """One schedule: its next fire times and its recent slots with the executions they requested."""
    with state.client() as client:
        s = client.schedule(name, next_count=count, slots=slots)
    if as_json:
        print_json(s)
        return
    state_ = styled("paused", "yellow") if s["paused"] else styled("active", "green")
    console.print(line((f"schedule {s['name']}", "bold"), "  ", state_, f"  {_spec(s)}"))
    does = f"{s['action_ref']} {s['parameters']}" if s["action_ref"] else f"emits events on trigger {s['trigger']}"
    console.print(f"  {does}", highlight=False)
    console.print(f"  catch-up {s['catchup']} within {s['catchup_window']:g}s, overlap {s['overlap']}", highlight=False)
    console.print("  next: " + (", ".join(when(t) for t in s["next_fire_times"]) or "(none left)"), highlight=False)
    table = Table("slot", "origin", "outcome", "execution", "status", "lag", title="recent slots")
    for r in s["slots"]:
        target = str(r["execution"] or (f"event {r['event']}" if r["event"] else r["error"] or "-"))
        table.add_row(
            when(r["slot"]),
            r["origin"],
            styled(r["outcome"], _STYLE.get(r["outcome"], "white")),
            target,
            r["execution_status"] or "-",
            f"{r['lag'] * 1000:.0f} ms",
        )
    console.print(table)


@app.command()
def pause(name: Name, as_json: bool = JsonResultOption) -> None:
    """Stop firing (the slots while paused are not fired; backfill them)."""
    with state.client() as client:
        was = client.pause_schedule(name)["was_paused"]
        if as_json:
            print_json({**client.schedule(name), "changed": not was})
            return
    console.print(f"schedule {name} {'was already paused' if was else 'paused'}", highlight=False)


@app.command()
def resume(name: Name, as_json: bool = JsonResultOption) -> None:
    """Fire again, from now."""
    with state.client() as client:
        was = client.resume_schedule(name)["was_paused"]
        if as_json:
            print_json({**client.schedule(name), "changed": was})
            return
    console.print(f"schedule {name} {'resumed' if was else 'was not paused'}", highlight=False)


@app.command()
def fire(name: Name, as_json: bool = JsonResultOption) -> None:
    """Fire now (origin manual)."""
    with state.client() as client:
        slot = client.fire_schedule(name)
    if as_json:
        print_json(slot)
    elif slot is None:
        console.print(f"schedule {name}: a slot was fired at this very instant already", highlight=False)
    else:
        made = f"execution {slot['execution']}" if slot["execution"] else f"event {slot['event']}"
        console.print(f"schedule {name} fired: {slot['outcome']} {made}", highlight=False)


@app.command()
def backfill(
    name: Name,
    since: Annotated[str, typer.Option("--since", help="From (ISO 8601, inclusive)")],
    until: Annotated[str, typer.Option("--until", help="To (ISO 8601, exclusive)")],
    as_json: bool = JsonResultOption,
) -> None:
    """Fire the slots of [since, until) not fired yet (origin backfill)."""
    with state.client() as client:
        rows = client.backfill_schedule(name, since, until)
    if as_json:
        print_json(rows)
    else:
        console.print(f"schedule {name}: {len(rows)} slots fired", highlight=False)


@app.command()
def delete(name: Name, as_json: bool = JsonResultOption) -> None:
    """Delete a schedule and its slot rows (the executions and events it made stay)."""
    with state.client() as client:
        client.delete_schedule(name)
    if as_json:
        print_json({"deleted": name})
        return
    console.print(f"schedule {name} deleted", highlight=False)
