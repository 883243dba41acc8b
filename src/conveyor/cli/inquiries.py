"""``conveyor inquiries list|get|respond``: the questions core.ask asks, and answering them.

The CLI works with database credentials, which may already do anything: it answers with
the admin role, as the user named by ``--as`` (default: ``CONVEYOR_USER``, else the
operating-system user; the same name ``conveyor run`` records as the requester)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, line, print_json, state, styled, when
from conveyor.cli.run import parse_json
from conveyor.domain.documents import DocumentError
from conveyor.domain.errors import ConveyorError

app = typer.Typer(help="List, show and answer inquiries (core.ask).", no_args_is_help=True)

_STYLE = {"pending": "cyan", "responded": "green", "timeout": "red", "cancelled": "yellow"}


class Status(StrEnum):
    pending = "pending"
    responded = "responded"
    timeout = "timeout"
    cancelled = "cancelled"
    all = "all"


@app.command("list")
def list_(
    status: Annotated[Status, typer.Option(help="Only this status (all: every one).")] = Status.pending,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    before: Annotated[int | None, typer.Option(help="Only ids below this (paging).")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Newest inquiries first (by default the pending ones)."""
    with state.client() as client:
        rows = client.inquiries(status=None if status is Status.all else status.value, limit=limit, before=before)
    if as_json:
        print_json(rows)
        return
    table = Table("id", "execution", "status", "prompt", "assignees", "answers", "deadline")
    for r in rows:
        table.add_row(
            str(r["id"]),
            str(r["execution"]),
            styled(r["status"], _STYLE.get(r["status"], "white")),
            r["prompt"],
            ", ".join(r["assignees"]) or "(operators)",
            f"{len(r['responders'])}/{r['quorum']}",
            when(r["deadline"]),
        )
    console.print(table)


@app.command()
def get(inquiry_id: Annotated[int, typer.Argument(help="Inquiry id")], as_json: bool = JsonOption) -> None:
    """One inquiry: its question, the schema of the answer, who may answer, and every answer given."""
    with state.client() as client:
        inquiry = client.inquiry(inquiry_id)
    if as_json:
        print_json(inquiry)
        return
    status = styled(inquiry["status"], _STYLE.get(inquiry["status"], "white"))
    console.print(line((f"inquiry {inquiry['id']}", "bold"), f"  execution {inquiry['execution']}  ", status))
    console.print(f"  prompt: {inquiry['prompt']}", highlight=False)
    console.print(f"  schema: {json.dumps(inquiry['schema'])}", highlight=False)
    assignees = ", ".join(inquiry["assignees"]) or "(any operator)"
    forbid = "  (the requester may not answer)" if inquiry["forbid_requester"] else ""
    console.print(f"  assignees: {assignees}  quorum: {inquiry['quorum']}{forbid}", highlight=False)
    console.print(
        f"  requested by: {inquiry['requester'] or '-'}  created {when(inquiry['created'])}"
        f"  deadline {when(inquiry['deadline'])}  on timeout: {json.dumps(inquiry['on_timeout'])}",
        highlight=False,
    )
    if inquiry["response"] is not None:
        console.print(f"  response: {json.dumps(inquiry['response'])}", highlight=False)
    if inquiry["responses"]:
        table = Table("responder", "role", "when", "answer", title="answers")
        for r in inquiry["responses"]:
            table.add_row(r["responder"], r["role"] or "-", when(r["created"]), json.dumps(r["data"]))
        console.print(table)


@app.command()
def respond(
    inquiry_id: Annotated[int, typer.Argument(help="Inquiry id")],
    data: Annotated[str, typer.Option("--data", "-d", help="The answer, as JSON (checked against the schema).")],
    as_: Annotated[
        str | None, typer.Option("--as", help="Who answers (default: CONVEYOR_USER, else your user name).")
    ] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Answer an inquiry. It completes its execution once enough distinct people answered
    (its quorum); an answer the schema refuses is an error naming each problem's path."""
    answer: Any = _answer(data)
    with state.client() as client:
        outcome = client.respond(inquiry_id, answer, responder=as_ or client.user)
    if as_json:
        print_json(outcome)
    elif outcome["outcome"] == "answered":
        console.print(f"inquiry {inquiry_id} answered; execution {outcome['execution']} completed", highlight=False)
    else:
        console.print(
            f"inquiry {inquiry_id}: answer recorded ({len(outcome['responders'])} so far; more responders are needed)",
            highlight=False,
        )


def _answer(raw: str) -> Any:
    try:
        return parse_json(raw)
    except DocumentError as exc:
        raise ConveyorError(f"--data: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, and numbers JSON cannot carry
        raise ConveyorError(f"--data is not JSON: {exc}") from None
