"""``conveyor policies list|set|delete``: admission policies (concurrency limits)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, err_console, line, print_json, state
from conveyor.sdk import Client

app = typer.Typer(help="Inspect and manage admission policies (concurrency limits).", no_args_is_help=True)


class Method(StrEnum):
    enqueue = "enqueue"
    cancel = "cancel"


Target = Annotated[str, typer.Argument(help="An action ref (pack.name), a pack (pack) or '*' (every action).")]


def summary(policy: dict[str, Any]) -> str:
    """One line an operator reads: the limit, its grouping, what happens beyond it."""
    per = f" per {', '.join(policy['parameters'])}" if policy["parameters"] else ""
    beyond = "others wait in request order" if policy["method"] == "enqueue" else "others are cancelled at once"
    return f"at most {policy['concurrency']} at once{per}; {beyond}"


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every policy (most specific first) with the slots it holds and the executions waiting."""
    with state.client() as client:
        rows = client.policies()
    if as_json:
        print_json(rows)
        return
    table = Table("target", "scope", "concurrency", "group by", "method", "source", "held", "waiting")
    for p in rows:
        table.add_row(
            p["target"],
            p["scope"],
            str(p["concurrency"]),
            ",".join(p["parameters"]) or "-",
            p["method"],
            p["source"],
            str(p["held"]),
            str(p["waiting"]),
        )
    console.print(table)


@app.command("set")
def set_(
    target: Target,
    concurrency: Annotated[int, typer.Option("--concurrency", "-n", help="Executions allowed at once (1 or more).")],
    group_by: Annotated[
        list[str] | None,
        typer.Option("--group-by", "-g", help="A parameter whose values each get their own limit (repeatable)."),
    ] = None,
    method: Annotated[
        Method, typer.Option(help="Beyond the limit: enqueue (wait in request order) or cancel (refuse at once).")
    ] = Method.enqueue,
    as_json: bool = JsonResultOption,
) -> None:
    """Create or replace the operator policy for TARGET.

    It wins over the action's own policy= and over less specific targets (action > pack > '*')."""
    parameters = group_by or []
    with state.client() as client:
        policy = client.set_policy(target, concurrency, parameters, method.value)
        notes = _notes(client, target, parameters)
    if as_json:
        print_json(policy)  # as `policies list --json` shows it
    else:
        console.print(f"policy {target} set: {summary(policy)}", highlight=False)
    for note in notes:
        err_console.print(line(("note:", "yellow"), f" {note}"), highlight=False)


def _notes(client: Client, target: str, parameters: list[str]) -> list[str]:
    """Likely typos: a target nothing matches yet, a parameter the action does not take."""
    if target == "*":
        return []
    actions = client.actions()
    if "." not in target:
        if any(a["pack"] == target for a in actions):
            return []
        return [f"no action of pack {target!r} is registered yet; the policy applies once one is"]
    action = next((a for a in actions if a["ref"] == target), None)
    if action is None:
        return [f"no worker has registered action {target!r} yet; the policy applies once one does"]
    schema = action["parameters_schema"]
    if schema.get("additionalProperties", True) is not False:  # any name may be a parameter
        return []
    unknown = [p for p in parameters if p not in (schema.get("properties") or {})]
    if unknown:
        return [f"{target} takes no parameter {', '.join(map(repr, unknown))}: every request would be in one group"]
    return []


@app.command()
def delete(target: Target, as_json: bool = JsonResultOption) -> None:
    """Delete the policy for TARGET; whoever it kept waiting may be scheduled.

    Deleting an override of an action's own policy= puts that one back."""
    with state.client() as client:
        deleted = client.delete_policy(target)
    if as_json:
        print_json({"deleted": target, "released": deleted["released"], "restored": deleted["restored"]})
        return
    console.print(f"policy {target} deleted; {deleted['released']} waiting execution(s) released", highlight=False)
    restored = deleted["restored"]
    if restored is not None:
        console.print(f"the action's own policy applies again: {summary(restored)}", highlight=False)


def describe_admission(admission: dict[str, Any]) -> str:
    """Where an execution stands in admission, for ``executions get``."""
    group = f", group {json.dumps(admission['group_key'])}" if admission["group_key"] else ""
    if admission["state"] == "holding":
        return f"holding a slot of policy {admission['policy']}{group}"
    ahead = admission["ahead"]
    return f"waiting for admission: policy {admission['policy']}{group}, {ahead} ahead"
