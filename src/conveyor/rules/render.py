"""Rule parameters rendered from an event, and the pure decision per (rule, event).

Templates use the workflows' sandboxed, bounded expression language
(conveyor.expressions): Jinja ``{{ trigger.body.x }}`` and YAQL
``<% $.trigger.body.x %>``, seeing ``trigger`` (the payload) and ``event`` (id, trigger,
source, received). Bounded tighter than a workflow's (one second): the executor renders
a whole batch of events in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from conveyor.domain.errors import InvalidRuleError
from conveyor.expressions import ExpressionError, Limits, Scope, evaluate
from conveyor.rules.criteria import Criterion, matches
from conveyor.rules.parse import criteria_of

LIMITS: Final = Limits(seconds=1.0, max_bytes=1 << 20)


def render(
    parameters: Mapping[str, Any], payload: Any, event: Mapping[str, Any], limits: Limits = LIMITS
) -> dict[str, Any]:
    """The parameters with their templates evaluated; raises ExpressionError."""
    scope = Scope(ctx={"trigger": payload, "event": dict(event)}, jinja_names=True)
    value = evaluate(dict(parameters), scope, limits)
    if not isinstance(value, dict):  # pragma: no cover - evaluate keeps a mapping a mapping
        raise ExpressionError("parameters", "did not render to an object")
    return value


@dataclass(frozen=True, slots=True)
class RuleRow:
    id: int
    ref: str
    criteria: Any  # as stored
    action_ref: str
    parameters: Mapping[str, Any]
    enabled: bool


@dataclass(frozen=True, slots=True)
class EventRow:
    id: int
    trigger: str
    payload: Any
    source: str
    received: str  # ISO 8601, as templates see it


@dataclass(frozen=True, slots=True)
class Decision:
    """What enforce_events (migration 0018) writes for one (rule, event)."""

    event: int
    rule: int
    rule_ref: str
    outcome: str  # requested | template_error | rule_disabled (| request_error: see refused)
    action_ref: str
    parameters: dict[str, Any] | None = None
    error: str | None = None

    def refused(self, reason: str) -> Decision:
        """A 'requested' decision the database refused to write: recorded as request_error."""
        if self.outcome != "requested":
            return self
        return Decision(self.event, self.rule, self.rule_ref, "request_error", self.action_ref, None, _text(reason))

    def as_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "rule": self.rule,
            "rule_ref": self.rule_ref,
            "outcome": self.outcome,
            "action_ref": self.action_ref,
            "parameters": self.parameters,
            "error": self.error,
        }


def decide(rule: RuleRow, event: EventRow, tree: Criterion | None = None, limits: Limits = LIMITS) -> Decision | None:
    """None: the criteria do not match (nothing is recorded). Otherwise the enforcement to
    write: rule_disabled, template_error (with the message) or requested (the rendered
    parameters). Pure: reads nothing but its arguments, raises nothing."""
    try:
        criterion = tree if tree is not None else criteria_of(rule.criteria)
    except InvalidRuleError as exc:  # criteria written around the API (raw SQL): say so where it shows
        return Decision(event.id, rule.id, rule.ref, "template_error", rule.action_ref, None, str(exc))
    if not matches(criterion, event.payload):
        return None
    if not rule.enabled:
        return Decision(event.id, rule.id, rule.ref, "rule_disabled", rule.action_ref)
    meta = {"id": event.id, "trigger": event.trigger, "source": event.source, "received": event.received}
    try:
        parameters = render(rule.parameters, event.payload, meta, limits)
    except ExpressionError as exc:
        return Decision(event.id, rule.id, rule.ref, "template_error", rule.action_ref, None, _text(str(exc)))
    if _has_nul(parameters):  # jsonb cannot hold NUL: refused here, not by the batch's write
        message = "the parameters rendered to a NUL character, which cannot be stored"
        return Decision(event.id, rule.id, rule.ref, "template_error", rule.action_ref, None, message)
    return Decision(event.id, rule.id, rule.ref, "requested", rule.action_ref, parameters)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def _text(message: str) -> str:
    # PostgreSQL text cannot hold NUL; an error quoting a template may contain one.
    return message.replace("\x00", "\\x00")
