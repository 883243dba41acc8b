"""The dashboard's answer form from an inquiry's JSON Schema (api/dashboard/forms.py), and
the checks around the inquiry verbs (domain/inquiries.py)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.api.dashboard.forms import Field, answer_fields
from conveyor.domain.inquiries import answer_problems, ask_problems


def test_an_object_of_simple_values_becomes_fields_required_first() -> None:
    fields = answer_fields({
        "type": "object",
        "properties": {
            "note": {"type": "string", "description": "why", "default": "none"},
            "ok": {"type": "boolean", "title": "Approve"},
            "size": {"enum": ["s", "m", 3]},
            "count": {"type": "integer", "minimum": 1},
            "ratio": {"type": "number"},
        },
        "required": ["ok", "count"],
    })  # fmt: skip
    assert fields is not None
    assert [(f.name, f.kind, f.required) for f in fields] == [
        ("ok", "choice", True), ("count", "integer", True), ("note", "text", False), ("size", "choice", False),
        ("ratio", "number", False),
    ]  # fmt: skip
    by_name = {f.name: f for f in fields}
    assert by_name["ok"].label == "Approve"
    assert by_name["ok"].options == (("true", "yes"), ("false", "no"))
    assert by_name["size"].options == (('"s"', "s"), ('"m"', "m"), ("3", "3"))
    assert (by_name["note"].default, by_name["note"].description) == ("none", "why")
    assert by_name["count"].input_id == "answer-count"


def test_a_schema_of_one_value_is_one_field() -> None:
    assert answer_fields({"type": "boolean"}) == [
        Field(None, "choice", "answer", True, options=(("true", "yes"), ("false", "no")))
    ]
    [only] = answer_fields({"enum": ["approve", "reject"]}) or []
    assert (only.name, only.kind, only.input_id) == (None, "choice", "answer-value")


@pytest.mark.parametrize(
    "schema",
    [
        {},  # any JSON
        {"type": "object"},  # no properties to make fields of
        {"type": "object", "properties": {"hosts": {"type": "array"}}},
        {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}},
        {"type": "object", "properties": {"a": {"type": "string"}}, "oneOf": [{"required": ["a"]}]},
        {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
        {"type": ["string", "null"]},
        {"$ref": "#/definitions/x"},
        "not a schema",
    ],
)
def test_what_the_form_cannot_express_falls_back_to_json(schema: Any) -> None:
    assert answer_fields(schema) is None


def test_answer_problems_name_every_path() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
              "items": {"type": "string"}}}, "required": ["c"]}  # fmt: skip
    assert answer_problems(schema, {"a": "x", "b": ["ok", 1]}) == [
        ("data", "'c' is a required property"),
        ("data.a", "'x' is not of type 'integer'"),
        ("data.b.1", "1 is not of type 'string'"),
    ]
    assert answer_problems({}, {"anything": [1]}) == []


def test_ask_problems() -> None:
    assert ask_problems({"prompt": "q"}) == []
    assert ask_problems({"prompt": "q", "schema": {"type": 5}})[0].startswith("schema.type: not a valid JSON Schema")
    assert ask_problems({"prompt": "q", "schema": {"type": "boolean"}, "on_timeout": {"default": "no"}}) == [
        "on_timeout.default: not a valid answer (data: 'no' is not of type 'boolean')"
    ]
    assert ask_problems({"prompt": "q", "assignees": ["a"], "quorum": 2}) == [
        "quorum: 2 distinct responders needed but only 1 assignees named"
    ]
    assert ask_problems({"prompt": "q", "assignees": ["a", "operator"], "quorum": 5}) == []  # a role: anyone of it
