"""Action verbs: recording the actions a process offers (a worker at start, and
``migrate``/``up`` for the core pack). The definitions in code are the source of truth:
each is written over its row, in one transaction with the others."""

from __future__ import annotations

from collections.abc import Iterable

from conveyor.actions.registry import ActionDefinition
from conveyor.store.rows import action_row
from conveyor.verbs.drive import Verb, sql


def offer(definitions: Iterable[ActionDefinition]) -> Verb[int]:
    """Insert or update each definition's ``action`` row; how many were written."""
    written = 0
    for definition in definitions:
        yield sql("upsert_action", action_row(definition), "none")
        written += 1
    return written
