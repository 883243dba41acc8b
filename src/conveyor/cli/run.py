"""``conveyor run ACTION key=value ... [--wait] [--at TIME | --in DURATION]``."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer

from conveyor.cli.context import JsonOption, console, print_json, state
from conveyor.cli.executions import show_execution
from conveyor.domain.delays import DelayError, parse_at, parse_duration
from conveyor.domain.errors import ConveyorError
from conveyor.domain.idempotency import check_idempotency_key
from conveyor.domain.status import ExecutionStatus


class _NotFinite(ValueError):
    """A number JSON cannot carry (NaN, Infinity, or beyond a double's range)."""


def _no_constant(text: str) -> Any:
    raise _NotFinite(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise _NotFinite(text)
    return value


def parse_json(raw: str) -> Any:
    """Strict JSON: Python's json module takes NaN and Infinity (and turns 1e400 into
    inf), none of which JSON, jsonb or the API can carry."""
    return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)


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


def run(
    action: Annotated[str, typer.Argument(help="Action ref, e.g. core.echo")],
    parameters: Annotated[list[str] | None, typer.Argument(help="key=value pairs")] = None,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait for the result; exit 1 unless it succeeded.")
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
    with state.client() as client:
        definition = client.action(action)
        params = parse_parameters(parameters or [], definition["parameters_schema"])
        execution_id = client.request(
            action, params, idempotency_key=idempotency_key, not_before=not_before, delay=delay
        )
        if not wait:
            if as_json:
                print_json({"id": execution_id})
            else:
                console.print(execution_id, highlight=False)
            return
        execution = client.wait(execution_id, timeout)
    if as_json:
        print_json(execution)
    else:
        show_execution(execution)
    if execution.status is not ExecutionStatus.COMPLETED:
        raise typer.Exit(1)
