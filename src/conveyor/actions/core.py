"""The built-in ``core`` pack, offered by every worker."""

from __future__ import annotations

import asyncio

from conveyor.actions.registry import ActionRegistry

core = ActionRegistry()


@core.action(
    "core.echo",
    parameters={
        "type": "object",
        "properties": {"message": {"type": "string", "description": "text to echo"}},
        "required": ["message"],
        "additionalProperties": False,
    },
)
def echo(message: str) -> str:
    """Return the message unchanged."""
    return message


@core.action("core.noop", parameters={"type": "object", "additionalProperties": False})
def noop() -> None:
    """Do nothing, successfully."""


@core.action(
    "core.sleep",
    parameters={
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0}},
        "required": ["seconds"],
        "additionalProperties": False,
    },
)
async def sleep(seconds: float) -> float:
    """Sleep without blocking the worker; returns the seconds slept."""
    await asyncio.sleep(seconds)
    return seconds


core.subprocess_action(
    "core.local",
    shell=True,
    command_parameter="cmd",
    parameters={
        "type": "object",
        "properties": {"cmd": {"type": "string", "minLength": 1, "description": "shell command to run"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
    stdin="none",
    description="Run a shell command on the worker (explicitly through /bin/sh -c).",
)
