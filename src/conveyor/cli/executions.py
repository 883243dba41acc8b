"""``conveyor executions list|get|cancel|tail|...``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from conveyor.cli.context import JsonOption, JsonResultOption, console, line, print_json, state, styled, when
from conveyor.cli.output import tail
from conveyor.cli.policies import describe_admission
from conveyor.cli.purge import purge
from conveyor.cli.workflows import show_tree
from conveyor.domain.models import Execution, ExecutionSummary
from conveyor.domain.status import ExecutionStatus
from conveyor.domain.storable import BASE64, readable
from conveyor.sdk import Client

app = typer.Typer(help="Inspect, cancel, pause, resume, rerun and purge executions.", no_args_is_help=True)
app.command("purge")(purge)
app.command("tail")(tail)

_STYLE = {
    "completed": "green",
    "failed": "red",
    "timeout": "red",
    "abandoned": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "scheduled": "blue",
    "pending": "magenta",
    "paused": "yellow",
    "canceling": "yellow",
}


def _status(status: str, not_before: datetime | None = None) -> Text:
    # A delayed request (or a retry's backoff) says until when it waits.
    shown = f"{status} (at {not_before.astimezone().strftime('%H:%M:%S')})" if not_before else status
    return styled(shown, _STYLE.get(status, "white"))


@app.command("list")
def list_(
    status: Annotated[ExecutionStatus | None, typer.Option(help="Only this status.")] = None,
    action: Annotated[str | None, typer.Option(help="Only this action ref.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    before: Annotated[int | None, typer.Option(help="Only ids below this (paging).")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Newest executions first."""
    with state.client() as client:
        rows = client.executions(status=status.value if status else None, action=action, limit=limit, before=before)
    if as_json:
        print_json(rows)
        return
    console.print(executions_table(rows))


def executions_table(rows: Sequence[Execution | ExecutionSummary]) -> Table:
    table = Table("id", "action", "status", "attempt", "worker", "created", "duration")
    for e in rows:
        duration = f"{(e.ended - e.started).total_seconds():.3f}s" if e.started and e.ended else "-"
        table.add_row(
            str(e.id),
            e.action_ref,
            _status(e.status, e.not_before),
            str(e.attempt),
            e.worker_name or "-",
            when(e.created),
            duration,
        )
    return table


ITEMS = 20  # items of a `with` task that `get` shows by default (and the mutating commands' --json)


@app.command()
def get(
    execution_id: Annotated[int, typer.Argument(help="Execution id")],
    items: Annotated[int, typer.Option(min=0, max=10_000, help="Items shown per `with` task.")] = ITEMS,
    as_json: bool = JsonOption,
) -> None:
    """One execution with its parameters, result and attempts.

    While an admission policy holds it, also where it stands: holding a slot, or waiting
    (with how many ahead). A workflow execution also shows its task tree: each task
    instance (task, iteration) with its children (item index, retries, child execution,
    status, attempt, a summary of the result)."""
    with state.client() as client:
        execution = client.get(execution_id)
        admission = client.admission(execution_id)
        tree = client.workflow_tree(execution_id, items=items)
    if as_json:
        print_json(document(execution, admission, tree))
        return
    show_execution(execution, admission)
    if tree is not None:
        show_tree(tree, items)


def document(execution: Execution, admission: dict[str, Any] | None, tree: dict[str, Any] | None) -> dict[str, Any]:
    """An execution as ``executions get --json`` shows it."""
    return {**dataclasses.asdict(execution), "admission": admission, "workflow": tree}


def print_execution(client: Client, execution_id: int) -> None:
    """``--json`` of the commands that change an execution: it as ``get --json`` shows it now."""
    tree = client.workflow_tree(execution_id, items=ITEMS)
    print_json(document(client.get(execution_id), client.admission(execution_id), tree))


class CancelPolicy(StrEnum):
    allow_finish = "allow_finish"
    cancel_running = "cancel_running"


@app.command()
def cancel(
    execution_id: Annotated[int, typer.Argument(help="Execution id")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it is cancelled.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 60.0,
    policy: Annotated[
        CancelPolicy | None,
        typer.Option(help="A running workflow's children: allow_finish (the default) or cancel_running."),
    ] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Cancel an execution: not started yet, it is cancelled at once; running, its worker
    stops it (process group killed) and records it cancelled. A finished one is an error.
    A running workflow is canceling until its children settle (--policy)."""
    with state.client() as client:
        status = client.cancel(execution_id, by="cli", policy=policy.value if policy else None)
        if status == "canceling" and wait:
            status = client.wait(execution_id, timeout=timeout).status.value
        if as_json:
            print_execution(client, execution_id)
            return
    if status == "canceling":
        console.print(f"execution {execution_id} canceling: its worker (or its workflow's children) stopping")
    else:
        console.print(line(f"execution {execution_id} ", _status(status)))


@app.command()
def pause(
    execution_id: Annotated[int, typer.Argument(help="A running workflow execution's id")],
    as_json: bool = JsonResultOption,
) -> None:
    """Pause a running workflow: no new task starts; children already running finish."""
    with state.client() as client:
        status = client.pause(execution_id, by="cli")
        if as_json:
            print_execution(client, execution_id)
            return
    console.print(line(f"execution {execution_id} ", _status(status)))


@app.command()
def resume(
    execution_id: Annotated[int, typer.Argument(help="A paused workflow execution's id")],
    as_json: bool = JsonResultOption,
) -> None:
    """Resume a paused workflow: its next tasks start."""
    with state.client() as client:
        status = client.resume(execution_id, by="cli")
        if as_json:
            print_execution(client, execution_id)
            return
    console.print(line(f"execution {execution_id} ", _status(status)))


@app.command()
def rerun(
    execution_id: Annotated[int, typer.Argument(help="Execution id")],
    from_failed: Annotated[
        bool,
        typer.Option("--from-failed", help="A failed workflow: run its failed tasks again, keep what completed."),
    ] = False,
    as_json: bool = JsonResultOption,
) -> None:
    """Run again as a new execution: the same action and parameters; with --from-failed, a
    failed (or cancelled) workflow from its failed tasks, keeping the results of the others.
    Prints the new execution's id (with --json: the new execution, as `get --json` shows it)."""
    with state.client() as client:
        new_id = client.rerun(execution_id, from_failed=from_failed, by="cli")
        if as_json:
            print_execution(client, new_id)
            return
    console.print(str(new_id))


def show_execution(e: Execution, admission: dict[str, Any] | None = None) -> None:
    console.print(
        line(
            (f"execution {e.id}", "bold"),
            "  ",
            e.action_ref,
            "  ",
            _status(e.status, e.not_before),
            f"  attempt {e.attempt}",
        )
    )
    if e.not_before is not None:
        console.print(f"  not before {when(e.not_before)}", highlight=False)
    console.print(f"  parameters: {json.dumps(e.parameters)}", highlight=False)
    console.print(f"  created {when(e.created)}  started {when(e.started)}  ended {when(e.ended)}")
    if e.requested_by is not None:
        console.print(f"  requested by {e.requested_by}", markup=False, highlight=False)
    if e.cancelled_by is not None:
        console.print(f"  cancellation asked by {e.cancelled_by}", markup=False, highlight=False)
    if admission is not None:
        console.print(f"  {describe_admission(admission)} (since {when(admission['since'])})", highlight=False)
    if isinstance(e.result, dict):
        for key in ("exit_code", "duration", "error", "data", "response", "responders"):
            if e.result.get(key) is not None:
                cut = key == "data" and e.result.get("data_truncated")
                flag = " (truncated: the start of its JSON text)" if cut else ""
                console.print(f"  {key}{flag}: {json.dumps(e.result[key])}", markup=False, highlight=False)
        for stream in ("stdout", "stderr"):
            text = e.result.get(stream)
            if text and isinstance(text, str):
                encoding = e.result.get(f"{stream}_encoding")
                flags = [
                    *(["truncated"] if e.result.get(f"{stream}_truncated") else []),
                    *(["not UTF-8 text: stored as base64, shown with \\xNN escapes"] if encoding == BASE64 else []),
                ]
                note = f" ({'; '.join(flags)})" if flags else ""
                console.print(f"  {stream}{note}:", markup=False, highlight=False)
                console.print(readable(text, encoding).rstrip("\n"), markup=False, highlight=False)
    if e.attempts:
        table = Table("attempt", "worker", "scheduled", "started", "ended", "outcome", "error", title="attempts")
        for a in e.attempts:
            table.add_row(
                str(a.attempt),
                a.worker_name or "-",
                when(a.scheduled),
                when(a.started),
                when(a.ended),
                a.outcome or "-",
                a.error or "",
            )
        console.print(table)
