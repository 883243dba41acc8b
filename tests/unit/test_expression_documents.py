"""Unit: the expression functions that read a document (``from_json_string``, ``json``,
``from_yaml_string``) read it within the ``documents.*`` settings, not the defaults: in a
workflow (the executor's Advancer) and in a rule's parameters (its Enforcer), as every
other door does (issue #25, point 1, follow-up)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conveyor.config import Settings
from conveyor.domain.documents import Limits as DocumentLimits
from conveyor.executor.events import Enforcer
from conveyor.executor.workflows import Advancer
from conveyor.expressions import ExpressionError, Limits, Scope, evaluate
from conveyor.rules.render import EventRow, RuleRow, decide
from conveyor.workflows.conductor import advance
from conveyor.workflows.state import Started, WorkflowState
from unit.workflows.conductor_kit import task, wf

TIGHT = DocumentLimits(max_nodes=1000)
BIG = json.dumps(list(range(1500)))  # 1,501 values: within the defaults, past TIGHT


@pytest.mark.parametrize(
    "expression", ["<% from_json_string($.t) %>", "<% json($.t) %>", "{{ from_yaml_string(ctx('t')) }}"]
)
def test_each_function_reads_within_the_limits_it_is_given(expression: str) -> None:
    scope = Scope(ctx={"t": BIG})
    assert evaluate(expression, scope) == list(range(1500))
    with pytest.raises(ExpressionError, match=r"more than 1000 nodes .*\(documents\.max_nodes\)"):
        evaluate(expression, scope, Limits(documents=TIGHT))


def test_from_yaml_string_still_takes_no_alias() -> None:
    with pytest.raises(ExpressionError, match=r"YAML aliases \(\*name\) are not allowed"):
        evaluate("<% from_yaml_string('a: &x [1]\nb: *x') %>", Scope(ctx={}), Limits(documents=TIGHT))


def test_a_workflow_evaluates_within_the_documents_settings() -> None:
    spec = wf(task("a"), vars=(("v", "<% from_json_string('" + BIG + "') %>"),))
    assert advance(spec, WorkflowState("running", {}), [Started({})]).context["v"] == list(range(1500))
    step = advance(spec, WorkflowState("running", {}), [Started({})], Limits(documents=TIGHT))
    assert step.status == "failed"
    assert "documents.max_nodes" in step.errors[0]["message"]


def test_a_rule_renders_within_the_documents_settings() -> None:
    rule = RuleRow(1, "r.one", {}, "core.echo", {"message": "{{ from_json_string(trigger.big) | length }}"}, True)
    event = EventRow(7, "t", {"big": BIG}, "sql", "2026-01-01T00:00:00+00:00")
    assert decide(rule, event).outcome == "requested"  # type: ignore[union-attr]
    refused = decide(rule, event, None, Limits(seconds=1.0, documents=TIGHT))
    assert refused is not None
    assert refused.outcome == "template_error"
    assert "documents.max_nodes" in str(refused.error)


def test_the_executor_passes_its_settings_on() -> None:
    settings = Settings.model_validate({"documents": {"max_nodes": 1000}})
    pool: Any = None  # neither reads a row here
    advancer = Advancer(pool, documents=settings.documents.limits())
    spec = wf(task("a"), vars=(("v", "<% json('" + BIG + "') %>"),))
    step = advancer._decide(spec, WorkflowState("running", {}), [Started({})])
    assert step.status == "failed"
    assert "documents.max_nodes" in step.errors[0]["message"]
    enforcer = Enforcer(pool, documents=settings.documents.limits())
    row = {"id": 7, "trigger": "t", "payload": {"big": BIG}, "source": "sql", "rules": [],
           "received": __import__("datetime").datetime(2026, 1, 1)}  # fmt: skip
    rule = {"id": 1, "ref": "r.one", "criteria": {}, "action_ref": "core.echo", "enabled": True, "updated": "u",
            "parameters": {"message": "{{ from_json_string(trigger.big) | length }}"}}  # fmt: skip
    [decision] = enforcer._decide({**row, "rules": [rule]})
    assert decision.outcome == "template_error"
    assert "documents.max_nodes" in str(decision.error)
