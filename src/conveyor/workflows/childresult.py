"""What a workflow author sees of a child execution's result: ``result()``.

A child's ``execution.result`` is what its runner stored: for actions run by a worker the
:class:`~conveyor.domain.models.ActionResult` envelope (``{"succeeded", "exit_code",
"data", "stdout", "stderr", "error", ...}``, written as is by worker/results.py), for
sub-workflows and inquiries the value itself (a workflow's output, an inquiry's answer).

``result()`` is what the author means by "the result":
- a Python action's return value (``data``): ``result().image``;
- a command that declared no JSON output: its output, ``{"stdout", "stderr",
  "exit_code"}`` (StackStorm's local runner shape, so Orquesta's ``result().stdout``
  works unchanged). Output that is not UTF-8 text (or holds a NUL) is stored as base64
  with ``stdout_encoding: "base64"``; it is given as the output API's chunk shape,
  ``{"encoding": "base64", "data": "<base64>"}``, so that it is never taken for the text
  of the output (``"YQBi/w=="`` was ``printf 'a\\0b\\377'``, its flag lost);
- a sub-workflow's output, an inquiry's answer: as they are;
- a failure: ``{"error": message}``, plus ``exit_code``/``stdout``/``stderr`` for an
  action (``result().stderr`` in a failure transition), plus ``errors`` for a failed
  sub-workflow (its error list).
"""

from __future__ import annotations

from typing import Any

_ENVELOPE = frozenset({"succeeded", "exit_code", "data"})
_OUTPUT = ("exit_code", "stdout", "stderr")


def is_envelope(result: Any) -> bool:
    """A runner's ActionResult (as opposed to a sub-workflow's output or an answer).
    Failures the executor records itself carry only ``succeeded`` and ``error``."""
    if not isinstance(result, dict) or not isinstance(result.get("succeeded"), bool):
        return False
    return result.keys() >= _ENVELOPE or "error" in result


def child_value(status: str, result: Any) -> tuple[Any, str | None]:
    """``(value, error)`` of a child that ended with ``status`` (an execution status):
    the value ``result()`` gives, and for a failure its message (the task's error)."""
    if status == "completed":
        if is_envelope(result):
            if result.get("data") is not None:
                return result["data"], None
            return _output(result, _OUTPUT), None
        return result, None
    error = _error_text(status, result)
    value: dict[str, Any] = {"error": error}
    if is_envelope(result):
        value.update(_output(result, tuple(k for k in _OUTPUT if k in result)))
    elif isinstance(result, list) and result and all(isinstance(e, dict) for e in result):
        value["errors"] = result
    return value, error


def _output(result: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The ``keys`` of an envelope, a stream stored as base64 with its flag (see the module doc)."""
    out = {k: result.get(k) for k in keys}
    for stream in ("stdout", "stderr"):
        if stream in out and result.get(f"{stream}_encoding") == "base64":
            out[stream] = {"encoding": "base64", "data": out[stream]}
    return out


def error_of(value: Any) -> str | None:
    """The message of a failed child's value (see :func:`child_value`)."""
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return str(value["error"])
    return None


def _error_text(status: str, result: Any) -> str:
    if isinstance(result, dict) and isinstance(result.get("error"), str) and result["error"]:
        return str(result["error"])
    if isinstance(result, str) and result:
        return result
    # A failed sub-workflow's result is its error list.
    if isinstance(result, list) and result and all(isinstance(e, dict) and "message" in e for e in result):
        return "; ".join(str(e["message"]) for e in result)
    return f"the child execution ended {status}"
