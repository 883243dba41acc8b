"""A rule as registered: what it listens to, what it checks, what it requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conveyor.rules.criteria import Criterion


@dataclass(frozen=True, slots=True)
class RuleSpec:
    ref: str
    trigger: str
    criteria: dict[str, Any]  # as written (stored in rule.criteria, parsed again by the executors)
    tree: Criterion  # the parsed criteria
    action_ref: str  # an action or a workflow
    parameters: dict[str, Any] = field(default_factory=dict)  # templates
    enabled: bool = True
    description: str | None = None
    definition: dict[str, Any] = field(default_factory=dict)  # the document registered

    def sql_args(self) -> dict[str, Any]:
        """register_rule's arguments (migration 0016)."""
        return {
            "ref": self.ref,
            "trigger": self.trigger,
            "criteria": self.criteria,
            "action_ref": self.action_ref,
            "parameters": self.parameters,
            "enabled": self.enabled,
            "description": self.description,
            "definition": self.definition,
        }
