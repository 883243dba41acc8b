"""Turning value types into query parameters."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from conveyor.actions.registry import ActionDefinition


def action_row(definition: ActionDefinition) -> dict[str, Any]:
    """Parameters for the ``upsert_action`` query."""
    row = definition.row()
    row["parameters_schema"] = Jsonb(row["parameters_schema"])
    row["metadata"] = Jsonb(row["metadata"])
    return row
