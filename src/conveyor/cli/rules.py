"""``conveyor rules register|list|get|delete|enable|disable`` (docs/rules.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, err_console, line, print_json, state, when
from conveyor.domain.errors import ConveyorError, InvalidRuleError
from conveyor.rules.parse import MAX_DOCUMENT

app = typer.Typer(help="Register, inspect, enable, disable and delete rules.", no_args_is_help=True)

Ref = Annotated[str, typer.Argument(help="The rule's ref (pack.name).")]


def read_files(files: list[Path]) -> list[Path]:
    """The files, checked readable first: a bad path is a one-line error, not a traceback."""
    for path in files:
        try:
            if path.stat().st_size > MAX_DOCUMENT:
                raise ConveyorError(f"{path}: over {MAX_DOCUMENT} bytes; is it a rule?")
            path.read_bytes()
        except OSError as exc:
            raise ConveyorError(f"cannot read {path}: {exc.strerror or exc}") from None
    return files


@app.command()
def register(
    files: Annotated[list[Path], typer.Argument(help="YAML or JSON rules (one each).", show_default=False)],
    as_json: bool = JsonResultOption,
) -> None:
    """Register (create or update) rules. Every file is checked first and every problem
    printed with its path; nothing is registered unless all are valid. --json: the rules,
    each as `get --json` shows it, with "created_now"."""
    paths = read_files(files)
    try:
        with state.client() as client:
            registered = client.register_rules(paths)
            if as_json:
                print_json([{**client.rule(r["ref"]), "created_now": r["created"]} for r in registered])
                return
    except InvalidRuleError as exc:
        for text in exc.lines():
            err_console.print(line(("error:", "red"), f" {text}"), highlight=False)
        err_console.print(f"nothing registered: {len(exc.problems)} problem(s)", highlight=False)
        raise typer.Exit(1) from None
    for r in registered:
        console.print(f"rule {r['ref']} {'registered' if r['created'] else 'updated'}", highlight=False)


@app.command("list")
def list_(
    trigger: Annotated[str | None, typer.Option("--trigger", help="Only the rules on this trigger.")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Rules, with their trigger, action and how many enforcements each made."""
    with state.client() as client:
        rows = client.rules(trigger=trigger)
    if as_json:
        print_json(rows)
        return
    table = Table("ref", "trigger", "action", "enabled", "enforcements", "updated")
    for r in rows:
        table.add_row(
            r["ref"],
            r["trigger"],
            r["action_ref"],
            "yes" if r["enabled"] else "no",
            str(r["enforcements"]),
            when(r["updated"]),
        )
    console.print(table)


@app.command()
def get(
    ref: Ref,
    enforcements: Annotated[int, typer.Option("--enforcements", min=0, max=1000, help="How many recent.")] = 20,
    as_json: bool = JsonOption,
) -> None:
    """A rule: its trigger, criteria, action and parameters, and its recent enforcements."""
    with state.client() as client:
        rule = client.rule(ref, enforcements=enforcements)
    if as_json:
        print_json(rule)
        return
    console.print(line((f"rule {rule['ref']}", "bold"), "" if rule["enabled"] else "  (disabled)"), highlight=False)
    if rule["description"]:
        console.print(f"  {rule['description']}", highlight=False)
    console.print(f"  trigger: {rule['trigger']}", highlight=False)
    console.print(f"  criteria: {json.dumps(rule['criteria'])}", highlight=False)
    console.print(f"  action: {rule['action_ref']} {json.dumps(rule['parameters'])}", highlight=False)
    table = Table("enforcement", "event", "outcome", "execution", "created", "error")
    for f in rule["enforcements"]:
        table.add_row(
            str(f["id"]),
            str(f["event"] or ""),
            f["outcome"],
            str(f["execution"] or ""),
            when(f["created"]),
            (f["error"] or "")[:200],
        )
    console.print(table)


@app.command()
def delete(ref: Ref, as_json: bool = JsonResultOption) -> None:
    """Delete a rule; its enforcements stay, naming it."""
    with state.client() as client:
        client.delete_rule(ref)
    if as_json:
        print_json({"deleted": ref})
        return
    console.print(f"rule {ref} deleted", highlight=False)


@app.command()
def enable(ref: Ref, as_json: bool = JsonResultOption) -> None:
    """Enable a rule: matching events request its action again."""
    with state.client() as client:
        was = client.enable_rule(ref)
        if as_json:
            print_json({**client.rule(ref), "changed": not was})
            return
    console.print(f"rule {ref} enabled{' (it was already)' if was else ''}", highlight=False)


@app.command()
def disable(ref: Ref, as_json: bool = JsonResultOption) -> None:
    """Disable a rule: matching events are recorded as 'rule_disabled', nothing requested."""
    with state.client() as client:
        was = client.disable_rule(ref)
        if as_json:
            print_json({**client.rule(ref), "changed": was})
            return
    console.print(f"rule {ref} disabled{'' if was else ' (it was already)'}", highlight=False)
