"""Turning value types into query parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.actions.registry import ActionDefinition


def action_row(definition: ActionDefinition) -> dict[str, Any]:
    """Parameters for the ``upsert_action`` query."""
    row = definition.row()
    row["parameters_schema"] = Jsonb(row["parameters_schema"])
    row["metadata"] = Jsonb(row["metadata"])
    return row


@dataclass(slots=True)
class Decisions:
    """Rows for the ``resolve_attempts`` query."""

    ids: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    delays: list[float | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, row: dict[str, Any], status: str, delay: float | None, error: str) -> None:
        self.ids.append(row["id"])
        self.attempts.append(row["attempt"])
        self.statuses.append(status)
        self.delays.append(delay)
        self.errors.append(error)

    def params(self, worker: int | None = None, **extra: Any) -> dict[str, Any]:
        return {"ids": self.ids, "attempts": self.attempts, "statuses": self.statuses,
                "delays": self.delays, "errors": self.errors, "worker": worker, **extra}  # fmt: skip
