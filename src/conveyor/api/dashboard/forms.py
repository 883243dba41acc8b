"""The answer form of an inquiry, generated from its JSON Schema.

A schema the form can express -- an object whose properties are strings, numbers,
integers, booleans or enums, or one such value alone -- becomes one field per value; any
other (nested objects, arrays, combinators, $ref) falls back to a JSON text area. Either
way the browser posts to ``/api/v1/inquiries/{id}/respond``, where the schema is checked
(conveyor.verbs.inquiries.check_answer), so the form is a convenience, never the validation."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SIMPLE = {"string", "number", "integer", "boolean"}
# Keywords a field can honour or safely leave to the server's check.
_FIELD_KEYS = {
    "type",
    "enum",
    "title",
    "description",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "const",
    "examples",
    "$comment",
}
_OBJECT_KEYS = {"type", "properties", "required", "additionalProperties", "title", "description", "$schema", "$comment"}


@dataclass(frozen=True, slots=True)
class Field:
    """One input. ``kind``: text, number, integer, or choice (a select whose options are
    JSON values: an enum or a boolean). ``name`` is None for a schema that is one value."""

    name: str | None
    kind: str
    label: str
    required: bool
    description: str = ""
    options: tuple[tuple[str, str], ...] = ()  # (JSON value, label)
    default: str = ""  # the initial value as the input holds it

    @property
    def input_id(self) -> str:
        return f"answer-{self.name}" if self.name is not None else "answer-value"


def _field(name: str | None, schema: Any, required: bool) -> Field | None:
    if not isinstance(schema, Mapping) or set(schema) - _FIELD_KEYS:
        return None
    label = str(schema.get("title") or name or "answer")
    description = str(schema.get("description") or "")
    default = schema.get("default")
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        options = tuple((json.dumps(v), v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"])
        chosen = json.dumps(default) if "default" in schema else ""
        return Field(name, "choice", label, required, description, options, chosen)
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in _SIMPLE:
        return None
    if kind == "boolean":
        chosen = json.dumps(default) if isinstance(default, bool) else ""
        return Field(name, "choice", label, required, description, (("true", "yes"), ("false", "no")), chosen)
    initial = "" if default is None or isinstance(default, (dict, list, bool)) else str(default)
    return Field(name, "text" if kind == "string" else kind, label, required, description, default=initial)


def answer_fields(schema: Any) -> list[Field] | None:
    """The fields of the form for ``schema``, or None: use the JSON text area."""
    if not isinstance(schema, Mapping) or not schema:
        return None
    if schema.get("type") != "object":
        one = _field(None, schema, True)
        return [one] if one is not None else None
    properties = schema.get("properties")
    if set(schema) - _OBJECT_KEYS or not isinstance(properties, Mapping) or not properties:
        return None
    required = set(schema.get("required") or [])
    fields = [_field(str(name), sub, name in required) for name, sub in properties.items()]
    if any(f is None for f in fields):
        return None
    # Required ones first (jsonb keeps no key order of its own to follow).
    return sorted((f for f in fields if f is not None), key=lambda f: not f.required)
