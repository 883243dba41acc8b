"""An action's parameters against its JSON Schema: the one full check, made by every door
before a request is stored (verbs.executions) and by the executor again before a claimed
execution is placed (what the database's own check, a subset of JSON Schema in SQL, let
through). Pure: the validators are built here and nothing is read or written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import jsonschema_rs

Problems = Callable[[Any], list[str]]


def checker(parameters_schema: dict[str, Any], *, root: str = "parameters") -> Problems:
    """The problems of a document against ``parameters_schema`` (none: valid), each
    ``path: message`` (``root`` for the document itself). Built once per schema (building
    it per document was most of a 100,000-row batch's time). Where the schema uses no
    keyword whose meaning differs between engines (see _engines_agree), a valid document is
    recognised by jsonschema_rs (~1 us, against ~35 us for jsonschema); any document it
    refuses is judged, and its problems worded, by jsonschema."""
    full = jsonschema.validators.validator_for(parameters_schema)(parameters_schema)
    fast = _fast_validator(parameters_schema)

    def problems(parameters: Any) -> list[str]:
        if fast is not None:
            try:
                if fast.is_valid(parameters):
                    return []
            except (ValueError, TypeError):  # not a JSON document: jsonschema decides
                pass
        elif full.is_valid(parameters):
            return []
        errors = sorted(full.iter_errors(parameters), key=lambda e: list(e.path))
        return [f"{'.'.join(str(p) for p in e.path) or root}: {e.message}" for e in errors]

    return problems


# Keywords whose meaning can differ between jsonschema and jsonschema_rs: regular
# expressions (Python's re against an ECMA-like engine), formats, and references (which
# might be fetched). A schema using any of them (even as a property name) is judged by
# jsonschema alone.
_ENGINE_SENSITIVE = frozenset({"pattern", "patternProperties", "format", "$ref", "$dynamicRef", "$recursiveRef"})


def _engines_agree(node: Any) -> bool:
    if isinstance(node, dict):
        return not (_ENGINE_SENSITIVE & node.keys()) and all(_engines_agree(v) for v in node.values())
    if isinstance(node, list):
        return all(_engines_agree(v) for v in node)
    return True


def _fast_validator(parameters_schema: dict[str, Any]) -> Any:
    if not _engines_agree(parameters_schema):
        return None
    try:
        return jsonschema_rs.validator_for(parameters_schema, validate_formats=False, offline=True)
    except Exception:  # a schema jsonschema_rs does not take: jsonschema alone
        return None
