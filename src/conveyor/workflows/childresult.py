"""What a workflow author sees of a child execution's result.

A child's ``execution.result`` is what its runner stored: for actions run by a worker the
:class:`~conveyor.domain.models.ActionResult` shape (``{"succeeded", "exit_code", "data",
"stdout", "stderr", "error", ...}``, worker/results.py writes it as is), for sub-workflows
and inquiries the value itself (a workflow's output, an inquiry's answer). ``result()`` in
a workflow is the action's return value, not the runner's envelope: Orquesta users write
``result().x`` for what a Python action returned.
"""

from __future__ import annotations

from typing import Any

_ENVELOPE = frozenset({"succeeded", "exit_code", "data"})


def is_envelope(result: Any) -> bool:
    """A runner's ActionResult (as opposed to a sub-workflow's output or an answer).
    Failures the executor records itself carry only ``succeeded`` and ``error``."""
    if not isinstance(result, dict) or not isinstance(result.get("succeeded"), bool):
        return False
    return result.keys() >= _ENVELOPE or "error" in result


def child_value(status: str, result: Any) -> tuple[Any, str | None]:
    """``(value, error)`` of a child that ended with ``status`` (an execution status).

    Completed: the value is the action's return value (``data``); a command that printed
    text but declared no JSON output gives its stdout instead, so a shell step's output
    is reachable as ``result()``. Otherwise the value is the error message, and ``error``
    repeats it (it becomes the task's error)."""
    if status == "completed":
        if is_envelope(result):
            data = result.get("data")
            if data is None and result.get("stdout"):
                return result["stdout"], None
            return data, None
        return result, None
    error = _error_text(status, result)
    return error, error


def _error_text(status: str, result: Any) -> str:
    if isinstance(result, dict) and isinstance(result.get("error"), str) and result["error"]:
        return str(result["error"])
    if isinstance(result, str) and result:
        return result
    # A failed sub-workflow's result is its error list.
    if isinstance(result, list) and result and all(isinstance(e, dict) and "message" in e for e in result):
        return "; ".join(str(e["message"]) for e in result)
    return f"the child execution ended {status}"
