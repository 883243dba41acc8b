"""``conveyor executions tail ID [--follow]``: an execution's live output (issue #15)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, TextIO

import typer

from conveyor.cli.context import state
from conveyor.cli.terminal import visible  # an action's output must not drive the terminal
from conveyor.domain.storable import output_text
from conveyor.sdk.output import OutputChunk


def _write(out: TextIO, chunk: OutputChunk | str) -> None:
    """On a terminal, text with what is not UTF-8 and control characters as \\xNN; piped, the
    exact bytes (a file gets what the action wrote)."""
    if out.isatty() or isinstance(chunk, str):
        out.write(visible(chunk if isinstance(chunk, str) else chunk.text()))
    else:
        out.flush()
        out.buffer.write(chunk.data)
    out.flush()  # as it comes: this is a live view


def tail(
    execution_id: Annotated[int, typer.Argument(help="Execution id.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the execution ends.")
    ] = False,
    after: Annotated[int, typer.Option(help="Only chunks after this one (a chunk id from --json).", min=0)] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per chunk and line (id, attempt, stream, encoding, data).")
    ] = False,
) -> None:
    """What an execution printed: a command's stdout and stderr, a Python action's ctx.log()
    lines, stored while it runs. stdout goes to stdout, stderr and log lines to stderr; a new
    attempt (a retry, a recovery) is announced on stderr. Exit 0 (also once a followed
    execution ends, whatever its outcome: `conveyor executions get` says how it ended)."""
    attempt = None
    try:
        with state.client() as client:
            for chunk in client.follow_output(execution_id, after=after, follow=follow):
                if as_json:
                    _json_line(chunk)
                    continue
                if chunk.attempt != attempt:
                    if attempt is not None:
                        _write(sys.stderr, f"--- attempt {chunk.attempt} ---\n")
                    attempt = chunk.attempt
                _write(sys.stdout if chunk.stream == "stdout" else sys.stderr, chunk)
    except KeyboardInterrupt:  # Ctrl-C while following: the usual way out, not an error
        raise typer.Exit(130) from None


def _json_line(chunk: OutputChunk) -> None:
    data, encoding = output_text(chunk.data)
    doc = {
        "id": chunk.id,
        "attempt": chunk.attempt,
        "stream": chunk.stream,
        "encoding": encoding,
        "data": data,
        "created": chunk.created.isoformat(),
    }
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
