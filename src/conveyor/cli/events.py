"""``conveyor events emit|list|get|replay`` and ``conveyor enforcements list|get`` (issue
#13): emit an event on a custom trigger (source ``cli``), read events with what their
rules decided, replay one event or a trigger's time window."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, line, print_json, state, styled, when
from conveyor.cli.run import parse_parameters
from conveyor.cli.triggers import read_json_file
from conveyor.domain.delays import MAX_DELAY, DelayError, DurationTooLong, check_aware, parse_duration
from conveyor.domain.errors import ConveyorError
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.sdk import Client

app = typer.Typer(help="Emit, list, show and replay events.", no_args_is_help=True)
enforcements = typer.Typer(help="List and show enforcements (what rules decided about events).", no_args_is_help=True)

_OUTCOME_STYLE = {"requested": "green", "template_error": "red", "request_error": "red", "rule_disabled": "yellow"}


class Outcome(StrEnum):
    requested = "requested"
    template_error = "template_error"
    request_error = "request_error"
    rule_disabled = "rule_disabled"


def _preview(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."


def parse_time(client: Client, option: str, text: str) -> datetime:
    """ISO 8601 with a UTC offset, or a duration ago (``1h``: the database's now() - 1h)."""
    try:
        return check_aware(datetime.fromisoformat(text.strip()), f"{option} {text!r}")
    except ValueError:
        pass
    try:
        ago = parse_duration(text)
    except DurationTooLong:
        raise ConveyorError(f"{option} {text!r}: at most {MAX_DELAY.days} days ago") from None
    except DelayError:
        raise ConveyorError(
            f"{option} {text!r}: give an ISO 8601 time with a UTC offset (2026-11-25T12:00:00+00:00) "
            "or a duration ago (30m, 1h, 2d)"
        ) from None
    return client.ago(ago)


@app.command()
def emit(
    trigger: Annotated[str, typer.Argument(help="Trigger name")],
    pairs: Annotated[list[str] | None, typer.Argument(help="key=value pairs of the payload")] = None,
    payload_file: Annotated[
        str | None, typer.Option("--payload-file", help="The payload as a JSON file ('-': standard input).")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Emit again with the same key and payload: one event.")
    ] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Emit an event (checked against the trigger's payload schema); prints its id alone."""
    check_idempotency_key(idempotency_key)
    if pairs and payload_file is not None:
        raise ConveyorError("give key=value pairs or --payload-file, not both")
    payload = read_json_file(payload_file, "--payload-file") if payload_file is not None else None
    with state.client() as client:
        if payload is None:
            schema = client.trigger(trigger)["payload_schema"] or {}
            payload = parse_parameters(pairs or [], schema)
        emitted = client.emit_event(trigger, payload, idempotency_key=idempotency_key, source="cli")
    if as_json:
        print_json(emitted)
    else:
        console.print(emitted["id"], highlight=False)


@app.command("list")
def list_(
    trigger: Annotated[str | None, typer.Option(help="Only this trigger's events.")] = None,
    source: Annotated[str | None, typer.Option(help="Only from this source (api, sdk, cli, sql, replay...).")] = None,
    since: Annotated[str | None, typer.Option(help="Received at or after: ISO 8601, or ago (1h).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    before: Annotated[int | None, typer.Option(help="Only ids below this (paging).")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Newest events first."""
    with state.client() as client:
        start = parse_time(client, "--since", since) if since is not None else None
        rows = client.events(trigger=trigger, source=source, since=start, limit=limit, before=before)
    if as_json:
        print_json(rows)
        return
    table = Table("id", "trigger", "source", "received", "replay of", "rules", "payload")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["trigger"],
            r["source"],
            when(r["received"]),
            str(r["replay_of"] or "-"),
            "pending" if r["pending"] else "evaluated",
            _preview(r["payload"]),
        )
    console.print(table)


@app.command()
def get(event_id: Annotated[int, typer.Argument(help="Event id")], as_json: bool = JsonOption) -> None:
    """One event with its payload, the enforcements its rules made, and its replays."""
    with state.client() as client:
        event = client.event(event_id)
    if as_json:
        print_json(event)
        return
    console.print(
        line(
            (f"event {event['id']}", "bold"),
            f"  {event['trigger']}  from {event['source']}  received {when(event['received'])}",
        )
    )
    console.print(f"  payload: {json.dumps(event['payload'], ensure_ascii=False)}", highlight=False)
    if event["idempotency_key"]:
        console.print(f"  idempotency key: {event['idempotency_key']}", highlight=False)
    if event["replay_of"]:
        console.print(f"  replay of event {event['replay_of']}", highlight=False)
    if event["pending"]:
        console.print("  rules: not evaluated yet", highlight=False)
    show_enforcements(event["enforcements"], title="enforcements")
    if event["replays"]:
        console.print("  replays: " + ", ".join(str(r["id"]) for r in event["replays"]), highlight=False)


def show_enforcements(rows: list[dict[str, Any]], title: str | None = None) -> None:
    if not rows and title:
        console.print(f"  {title}: none", highlight=False)
        return
    table = Table("id", "rule", "event", "outcome", "execution", "error", "created", title=title)
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["rule_ref"],
            str(r["event"] or "-"),
            styled(r["outcome"], _OUTCOME_STYLE.get(r["outcome"], "white")),
            str(r["execution"] or "-"),
            r["error"] or "",
            when(r["created"]),
        )
    console.print(table)


@app.command()
def replay(
    event_id: Annotated[int | None, typer.Argument(help="Event id (or --trigger and --since)")] = None,
    trigger: Annotated[str | None, typer.Option(help="Replay this trigger's events in a time window.")] = None,
    since: Annotated[str | None, typer.Option(help="Window start: ISO 8601, or ago (1h).")] = None,
    until: Annotated[str | None, typer.Option(help="Window end (default: now).")] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Emit an event again (a new event naming the original: its rules are evaluated
    again), or every event of --trigger received in [--since, --until)."""
    if (event_id is None) == (trigger is None):
        raise ConveyorError("give an event id, or --trigger with --since (and maybe --until)")
    if event_id is not None and (since is not None or until is not None):
        raise ConveyorError("--since and --until go with --trigger, not with an event id")
    with state.client() as client:
        if event_id is not None:
            new_id = client.replay_event(event_id)
            if as_json:
                print_json({"id": new_id, "replay_of": event_id})
            else:
                console.print(f"event {event_id} replayed as event {new_id}", highlight=False)
            return
        assert trigger is not None
        if since is None:
            raise ConveyorError("--trigger needs --since (the start of the window)")
        start = parse_time(client, "--since", since)
        end = parse_time(client, "--until", until) if until is not None else None
        pairs = client.replay_events(trigger, start, end)
    if as_json:
        print_json([{"original": o, "replay": r} for o, r in pairs])
    else:
        console.print(
            f"{len(pairs)} event(s) of {trigger} replayed" + "".join(f"\n  {o} -> {r}" for o, r in pairs),
            highlight=False,
        )


@enforcements.command("list")
def list_enforcements(
    rule: Annotated[str | None, typer.Option(help="Only this rule's (its ref).")] = None,
    event: Annotated[int | None, typer.Option(help="Only for this event.")] = None,
    outcome: Annotated[Outcome | None, typer.Option(help="Only this outcome.")] = None,
    since: Annotated[str | None, typer.Option(help="Created at or after: ISO 8601, or ago (1h).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    before: Annotated[int | None, typer.Option(help="Only ids below this (paging).")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Newest enforcements first."""
    with state.client() as client:
        start = parse_time(client, "--since", since) if since is not None else None
        rows = client.enforcements(
            rule=rule, event=event, outcome=outcome.value if outcome else None, since=start, limit=limit, before=before
        )
    if as_json:
        print_json(rows)
    else:
        show_enforcements(rows)


@enforcements.command("get")
def get_enforcement(
    enforcement_id: Annotated[int, typer.Argument(help="Enforcement id")], as_json: bool = JsonOption
) -> None:
    """One enforcement: the rule, the event, the outcome, the execution it requested or why not."""
    with state.client() as client:
        row = client.enforcement(enforcement_id)
    if as_json:
        print_json(row)
        return
    console.print(
        line(
            (f"enforcement {row['id']}", "bold"),
            f"  rule {row['rule_ref']}  event {row['event']} ({row['trigger'] or '-'})  ",
            styled(row["outcome"], _OUTCOME_STYLE.get(row["outcome"], "white")),
        )
    )
    if row["execution"]:
        console.print(f"  execution: {row['execution']}", highlight=False)
    if row["parameters"] is not None:
        console.print(f"  parameters: {json.dumps(row['parameters'], ensure_ascii=False)}", highlight=False)
    if row["error"]:
        console.print(f"  error: {row['error']}", highlight=False)
    console.print(f"  created {when(row['created'])}", highlight=False)
