"""Pure unit tests: the CLI's ``key=value`` parameter parser, typed by the action's
parameter schema. No database, no processes."""

from __future__ import annotations

import pytest

from conveyor.cli.run import parse_parameters
from conveyor.domain.errors import ConveyorError

# ---------------------------------------------------------------------------
# CLI parameter parsing
# ---------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "message": {"type": "string"},
        "seconds": {"type": "number"},
        "flag": {"type": "boolean"},
        "maybe": {"type": ["string", "null"]},
        "untyped": {},
    },
}


def test_parse_parameters_uses_the_schema_types() -> None:
    params = parse_parameters(
        ["message=1", "seconds=1.5", "flag=true", "maybe=null", "untyped=[1,2]", 'other={"a":1}'], SCHEMA
    )
    assert params == {
        "message": "1",  # declared string: stays text
        "seconds": 1.5,
        "flag": True,
        "maybe": None,
        "untyped": [1, 2],
        "other": {"a": 1},
    }


def test_parse_parameters_edge_cases() -> None:
    assert parse_parameters([], SCHEMA) == {}
    assert parse_parameters(["message=a=b"], SCHEMA) == {"message": "a=b"}
    assert parse_parameters(["message="], SCHEMA) == {"message": ""}
    assert parse_parameters(["seconds=soon"], SCHEMA) == {"seconds": "soon"}  # left for validation
    assert parse_parameters(["word=hello"], SCHEMA) == {"word": "hello"}  # not JSON: text
    assert parse_parameters(["n=3"], {}) == {"n": 3}
    assert parse_parameters(["message=x", "message=y"], SCHEMA) == {"message": "y"}
    assert parse_parameters(['message="quoted"'], SCHEMA) == {"message": '"quoted"'}


@pytest.mark.parametrize("pair", ["novalue", "=value", ""])
def test_parse_parameters_refuses_malformed_pairs(pair: str) -> None:
    with pytest.raises(ConveyorError, match="is not key=value"):
        parse_parameters([pair], SCHEMA)
