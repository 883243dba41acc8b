"""``conveyor run ACTION key=value ... [--wait] [--at TIME | --in DURATION]``."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, BinaryIO

import typer

from conveyor.cli import run_progress
from conveyor.cli.context import JsonOption, console, err_console, print_json, state
from conveyor.cli.executions import show_execution
from conveyor.domain import jsontext
from conveyor.domain.delays import DelayError, parse_at, parse_duration
from conveyor.domain.documents import DocumentError, load_json
from conveyor.domain.errors import ConveyorError
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.domain.status import ExecutionStatus

_NotFinite = jsontext.NotFinite


def parse_json(raw: str | bytes) -> Any:
    """JSON a user typed or gave as a file: strict (no NaN, Infinity or 1e400:
    domain/jsontext.py) and within the ``documents`` bounds (a ``DocumentError``)."""
    return load_json(raw, state.loaded.settings.documents.limits())


def parse_parameters(pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """``key=value`` pairs; a value is taken as JSON when the action's schema says the
    parameter is not a string (so ``seconds=1`` is a number, ``message=1`` stays text)."""
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConveyorError(f"parameter {pair!r} is not key=value")
        declared = properties.get(key, {}).get("type") if isinstance(properties.get(key), dict) else None
        types = declared if isinstance(declared, list) else [declared]
        if types == ["string"]:
            params[key] = raw
            continue
        try:
            params[key] = parse_json(raw)
        except DocumentError as exc:
            raise ConveyorError(f"parameter {key}: {exc}") from None
        except _NotFinite as exc:
            if "string" in types:  # the text is a valid value as it is
                params[key] = raw
                continue
            raise ConveyorError(
                f"parameter {key}: {exc} is not a number JSON can carry (NaN, Infinity and numbers beyond "
                "about 1.8e308 are refused); give a finite number"
            ) from None
        except json.JSONDecodeError:
            params[key] = raw
    return params


STDIN = "-"


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):  # before int: True is an int
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def read_params_file(source: str, limit: int, stdin: BinaryIO | None = None) -> dict[str, Any]:
    """The parameters in ``source`` (a path, or ``-`` for standard input): one JSON object
    of at most ``limit`` bytes, as strict as ``parse_json``. Every problem is one
    ConveyorError naming the file."""
    name = "standard input" if source == STDIN else source
    where = f"--params-file {name}"
    try:
        if source == STDIN:
            raw = (stdin if stdin is not None else sys.stdin.buffer).read(limit + 1)
        else:
            with open(source, "rb") as file:
                raw = file.read(limit + 1)  # never more: a huge file is refused, not loaded
    except FileNotFoundError:
        raise ConveyorError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise ConveyorError(f"{where}: is a directory, not a file") from None
    except OSError as exc:
        raise ConveyorError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise ConveyorError(
            f"{where}: larger than {limit} bytes, the largest request the API accepts (api.max_body_bytes)"
        )
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark (some Windows editors write one) is not JSON
    except UnicodeDecodeError as exc:
        raise ConveyorError(f"{where}: not UTF-8 text (byte {exc.start + 1})") from None
    try:
        value = parse_json(text)
    except json.JSONDecodeError as exc:
        raise ConveyorError(f"{where}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except _NotFinite as exc:
        raise ConveyorError(
            f"{where}: {exc} is not a number JSON can carry (NaN, Infinity and numbers beyond about 1.8e308 "
            "are refused); give a finite number"
        ) from None
    except DocumentError as exc:  # past the documents.* bounds, or a key named twice
        raise ConveyorError(f"{where}: {exc}") from None
    if not isinstance(value, dict):
        raise ConveyorError(
            f'{where}: expected a JSON object of parameters ({{"key": value, ...}}), not {_kind(value)}'
        )
    return value


def merge_parameters(from_file: dict[str, Any], pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """``--params-file``'s parameters with the ``key=value`` pairs over them: a pair replaces
    its key's value whole (a nested object is not merged), so one value can be changed on
    the command line without editing the file."""
    return {**from_file, **parse_parameters(pairs, schema)}


def run(
    action: Annotated[str, typer.Argument(help="Action ref, e.g. core.echo")],
    parameters: Annotated[
        list[str] | None, typer.Argument(help="key=value pairs; they override the keys of --params-file")
    ] = None,
    params_file: Annotated[
        str | None,
        typer.Option(
            "--params-file",
            metavar="FILE",
            help="Parameters as one JSON object, from FILE or standard input (-): for values too large for "
            "the command line or awkward to quote. key=value arguments override its keys.",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            "-w",
            help="Wait for the result; exit 1 unless it succeeded. On a terminal, shows its progress on stderr.",
        ),
    ] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after this many seconds.")] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Run again with the same key (and the same action and parameters): the same execution, "
            "not a new one (keys are kept at least 24 h).",
        ),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Not before this time: ISO 8601 with a UTC offset, e.g. 2026-11-25T12:00:05+00:00."),
    ] = None,
    in_: Annotated[
        str | None,
        typer.Option("--in", help="Not before this long from now (the database's clock), e.g. 30s, 5m, 1h30m."),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Request an execution. Without --wait, print its id alone (for scripts). With --at or
    --in it waits in 'requested' until then."""
    check_idempotency_key(idempotency_key)  # before connecting: a typo is told at once
    if at is not None and in_ is not None:
        raise DelayError("give --at or --in, not both")
    not_before = parse_at(at) if at is not None else None
    delay = parse_duration(in_) if in_ is not None else None
    # Read before connecting, as the checks above: a missing file is told at once.
    from_file = (
        read_params_file(params_file, state.loaded.settings.api.max_body_bytes) if params_file is not None else {}
    )
    with state.client() as client:
        definition = client.action(action)
        params = merge_parameters(from_file, parameters or [], definition["parameters_schema"])
        execution_id = client.request(
            action, params, idempotency_key=idempotency_key, not_before=not_before, delay=delay
        )
        if not wait:
            if as_json:
                print_json({"id": execution_id})
            else:
                console.print(execution_id, highlight=False)
            return
        if run_progress.wanted(as_json):
            with run_progress.Progress(
                err_console, execution_id, action, lambda: client.get(execution_id).attempts
            ) as shown:
                execution = client.wait(execution_id, timeout, on_poll=shown, interval=run_progress.POLL_INTERVAL)
        else:
            execution = client.wait(execution_id, timeout)
    if as_json:
        print_json(execution)
    else:
        show_execution(execution)
    if execution.status is not ExecutionStatus.COMPLETED:
        raise typer.Exit(1)
