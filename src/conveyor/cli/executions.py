"""``conveyor executions list|get|cancel``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from conveyor.cli.context import JsonOption, console, line, print_json, state, styled, when
from conveyor.cli.policies import describe_admission
from conveyor.domain.models import Execution, ExecutionSummary
from conveyor.domain.status import ExecutionStatus
from conveyor.domain.storable import BASE64, readable

app = typer.Typer(help="Inspect and cancel executions.", no_args_is_help=True)

_STYLE = {
    "completed": "green",
    "failed": "red",
    "timeout": "red",
    "abandoned": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "scheduled": "blue",
}


def _status(status: str) -> Text:
    return styled(status, _STYLE.get(status, "white"))


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
            str(e.id), e.action_ref, _status(e.status), str(e.attempt), e.worker_name or "-", when(e.created), duration
        )
    return table


@app.command()
def get(execution_id: Annotated[int, typer.Argument(help="Execution id")], as_json: bool = JsonOption) -> None:
    """One execution with its parameters, result and attempts.

    While an admission policy holds it, also where it stands: holding a slot, or waiting
    (with how many ahead)."""
    with state.client() as client:
        execution = client.get(execution_id)
        admission = client.admission(execution_id)
    if as_json:
        print_json({**dataclasses.asdict(execution), "admission": admission})
    else:
        show_execution(execution, admission)


@app.command()
def cancel(
    execution_id: Annotated[int, typer.Argument(help="Execution id")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it is cancelled.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 60.0,
) -> None:
    """Cancel an execution: not started yet, it is cancelled at once; running, its worker
    stops it (process group killed) and records it cancelled. A finished one is an error."""
    with state.client() as client:
        status = client.cancel(execution_id, by="cli")
        if status == "canceling" and wait:
            status = client.wait(execution_id, timeout=timeout).status.value
    if status == "canceling":
        console.print(f"execution {execution_id} canceling: its worker is stopping it")
    else:
        console.print(line(f"execution {execution_id} ", _status(status)))


def show_execution(e: Execution, admission: dict[str, Any] | None = None) -> None:
    console.print(
        line((f"execution {e.id}", "bold"), "  ", e.action_ref, "  ", _status(e.status), f"  attempt {e.attempt}")
    )
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
