"""``conveyor workflows register|list|get|delete``: workflow definitions (docs/workflows-usage.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from conveyor.cli.context import (
    JsonOption,
    JsonResultOption,
    console,
    err_console,
    line,
    print_json,
    state,
    styled,
    when,
)
from conveyor.cli.terminal import visible
from conveyor.domain.errors import ConveyorError, InvalidWorkflowError
from conveyor.workflows.graph import describe, graph
from conveyor.workflows.registration import MAX_SOURCE, Definition
from conveyor.workflows.spec import WorkflowSpec

app = typer.Typer(help="Register, inspect and delete workflow definitions.", no_args_is_help=True)

Ref = Annotated[str, typer.Argument(help="The workflow's ref (pack.name).")]


def read_definitions(files: list[Path], ref: str | None) -> list[Definition]:
    """The files as definitions; a file that cannot be read is a one-line error."""
    if ref is not None and len(files) != 1:
        raise ConveyorError("--ref names one definition: give exactly one FILE with it")
    definitions = []
    for path in files:
        try:
            if path.stat().st_size > MAX_SOURCE * 4:  # before reading it all: each character is at most 4 bytes
                raise ConveyorError(f"{path}: over {MAX_SOURCE} characters; is it a workflow definition?")
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConveyorError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise ConveyorError(f"cannot read {path}: {exc.strerror or exc}") from None
        definitions.append(Definition(text=text, ref=ref, where=str(path)))
    return definitions


@app.command()
def register(
    files: Annotated[list[Path], typer.Argument(help="YAML definitions (one workflow each).", show_default=False)],
    ref: Annotated[
        str | None, typer.Option("--ref", help="The ref of a definition that names none (no `ref:` in it).")
    ] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Register workflow definitions: each becomes an action runnable with `conveyor run REF`.

    Every file is checked first (syntax, unknown actions and tasks, unreachable tasks,
    expressions) and every problem printed with its path; nothing is registered unless all
    are valid. Registering a ref again makes a new version: running workflows finish on the
    version they started with. --json: the versions registered, each as `get --json` shows it."""
    definitions = read_definitions(files, ref)
    try:
        with state.client() as client:
            registered = client.register_workflows(definitions)
            if as_json:
                print_json([client.workflow(r["ref"], version=r["version"]) for r in registered])
                return
    except InvalidWorkflowError as exc:
        for text in exc.lines():
            err_console.print(line(("error:", "red"), f" {text}"), highlight=False)
        err_console.print(f"nothing registered: {len(exc.problems)} problem(s)", highlight=False)
        raise typer.Exit(1) from None
    for r in registered:
        console.print(f"workflow {r['ref']} registered: version {r['version']}", highlight=False)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Registered workflows, with their latest version."""
    with state.client() as client:
        rows = client.workflows()
    if as_json:
        print_json(rows)
        return
    table = Table("ref", "version", "tasks", "registered", "description")
    for w in rows:
        description = (w["description"] or "").splitlines()
        table.add_row(
            w["ref"], str(w["version"]), str(w["tasks"]), when(w["registered"]), description[0] if description else ""
        )
    console.print(table)


@app.command()
def get(
    ref: Ref,
    version: Annotated[int | None, typer.Option("--version", min=1, help="This version (default: the latest).")] = None,
    source: Annotated[bool, typer.Option("--source", help="Print the definition as registered (its YAML).")] = False,
    as_json: bool = JsonOption,
) -> None:
    """A definition: its inputs, its graph (tasks and their transitions) and its versions."""
    with state.client() as client:
        workflow = client.workflow(ref, version=version)
    if as_json:
        print_json(workflow)
        return
    if source:  # exactly as registered (a spec built in Python has none: its stored form)
        text = workflow["source"] or json.dumps(workflow["definition"], indent=2) + "\n"
        sys.stdout.write(visible(text) if sys.stdout.isatty() else text)  # piped: the file as registered
        return
    show_workflow(workflow)


def show_workflow(workflow: dict[str, Any]) -> None:
    spec = WorkflowSpec.from_json(workflow["definition"])
    versions = workflow["versions"]
    console.print(
        line((f"workflow {spec.ref}", "bold"), f"  version {workflow['version']} of {len(versions)}"),
        highlight=False,
    )
    if spec.description:
        console.print(f"  {spec.description}", highlight=False)
    inputs = [f"{i.name}={json.dumps(i.default)}" if i.has_default else i.name for i in spec.input]
    console.print(f"  input: {', '.join(inputs) if inputs else '(none)'}", highlight=False)
    if spec.output:
        console.print(f"  output: {', '.join(name for name, _ in spec.output)}", highlight=False)
    console.print(f"  registered {when(workflow['registered'])}", highlight=False)
    console.print(line(("graph", "bold"), f" ({len(spec.tasks)} tasks; start: {', '.join(spec.starts()) or '-'})"))
    for text in describe(graph(spec)):
        console.print(f"  {text}", highlight=False)


@app.command()
def delete(ref: Ref, as_json: bool = JsonResultOption) -> None:
    """Delete a workflow (every version): it can no longer be run. Executions already
    running finish on the version they started with."""
    with state.client() as client:
        deleted = client.delete_workflow(ref)
    if as_json:
        print_json({"deleted": ref, "versions": deleted})
        return
    console.print(f"workflow {ref} deleted ({deleted} version(s))", highlight=False)


# -- a workflow execution's task tree (`conveyor executions get ID`) -----------------------

_TASK_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "waiting": "white",
    "pending": "magenta",
}


def _child_cells(c: dict[str, Any]) -> list[str | Text]:
    return [
        styled(c["status"], _TASK_STYLE.get(c["status"], "white")),
        str(c["retry"]),
        str(c["execution"] or "-"),
        c["execution_status"] or "-",
        str(c["attempt"] if c["attempt"] is not None else "-"),
        c["result"] or "",
    ]


def show_tree(tree: dict[str, Any], items: int) -> None:
    """The workflow's state, then one row per task instance and, for a `with` task, one
    per item shown (at most ``items``; the counts cover them all)."""
    rerun = f"  rerun of {tree['rerun_of']}" if tree["rerun_of"] else ""
    status = styled(tree["status"], _TASK_STYLE.get(tree["status"], "white"))
    head = line((f"workflow {tree['workflow_ref']}", "bold"), f" version {tree['version']}  ", status, rerun)
    console.print(head, highlight=False)
    for error in tree["errors"] or []:
        console.print(f"  error: {json.dumps(error, ensure_ascii=False)}", highlight=False)
    if tree["output"] is not None:
        console.print(f"  output: {json.dumps(tree['output'], ensure_ascii=False)[:500]}", highlight=False)
    table = Table(
        "task", "iter", "item", "status", "retries", "child", "child status", "attempt", "result", title="tasks"
    )
    for t in tree["tasks"]:
        children = t["children"]
        if t["items_total"] is None and len(children) <= 1:  # one child (or none): one row
            cells = _child_cells(children[0])[1:] if children else ["-", "-", "-", "-", t["error"] or ""]
            if children and t["error"]:
                cells[-1] = t["error"]
            status = styled(t["status"], _TASK_STYLE.get(t["status"], "white"))
            table.add_row(t["task"], str(t["iteration"]), "-", status, *cells)
            continue
        counts = ", ".join(f"{k} {v}" for k, v in sorted(t["counts"].items()))
        total = t["items_total"] if t["items_total"] is not None else t["children_total"]
        table.add_row(
            t["task"],
            str(t["iteration"]),
            f"{total} items",
            styled(t["status"], _TASK_STYLE.get(t["status"], "white")),
            "",
            "",
            "",
            "",
            t["error"] or counts,
        )
        for c in children:
            table.add_row("", "", f"[{c['index']}]" if c["index"] is not None else "-", *_child_cells(c))
        hidden = t["children_total"] - len(children)
        if hidden > 0:
            table.add_row("", "", f"… {hidden} more", "", "", "", "", "", f"(--items {items} shows the first {items})")
    if not tree["tasks"]:
        table.add_row("(no task started yet)", "", "", "", "", "", "", "", "")
    console.print(table)
