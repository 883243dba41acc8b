"""Pure unit tests: the action registry (definitions, refs, parameter schemas from
signatures). No database, no processes."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from conveyor.actions.core import core
from conveyor.actions.registry import ActionDefinition, ActionRegistry, schema_from_signature

# ---------------------------------------------------------------------------
# The action registry
# ---------------------------------------------------------------------------


def _typed(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    extra: dict[str, Any],
    maybe: int | None = None,
    anything: Any = None,
    *args: Any,
    **kwargs: Any,
) -> None:
    """Docstring becomes the description."""


def test_schema_from_signature() -> None:
    schema = schema_from_signature(_typed)
    assert schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "tags": {"type": "array"},
            "extra": {"type": "object"},
            "maybe": {"type": ["integer", "null"]},
            "anything": {},
        },
        "required": ["name", "count", "ratio", "flag", "tags", "extra"],
        "additionalProperties": False,
    }
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    ok = {"name": "a", "count": 1, "ratio": 0.5, "flag": True, "tags": [], "extra": {}}
    assert validator.is_valid(ok)
    assert validator.is_valid({**ok, "maybe": None, "anything": [1]})
    assert not validator.is_valid({**ok, "count": "1"})
    assert not validator.is_valid({**ok, "unknown": 1})
    assert not validator.is_valid({k: v for k, v in ok.items() if k != "name"})


def test_registry_derives_schema_and_metadata() -> None:
    registry = ActionRegistry()

    @registry.action("mypack.greet")
    def greet(who: str, times: int = 1) -> str:
        """Say hello."""
        return who * times

    definition = registry.get("mypack.greet")
    assert definition is not None
    assert definition.runner_type == "python"
    assert definition.runtime == "python"
    assert definition.pack == "mypack"
    assert definition.name == "greet"
    assert definition.description == "Say hello."
    assert definition.parameters_schema["required"] == ["who"]
    assert definition.parameters_schema["properties"]["times"] == {"type": "integer"}
    assert definition.metadata["async"] is False
    assert definition.metadata["entry_point"].endswith(":test_registry_derives_schema_and_metadata.<locals>.greet")
    assert definition.func is greet
    assert len(registry) == 1
    row = definition.row()
    assert row["ref"] == "mypack.greet"
    assert row["pack"] == "mypack"
    assert row["name"] == "greet"

    @registry.action("mypack.wait", parameters={"type": "object"}, description="custom", timeout=3)
    async def wait() -> None:
        return None

    waited = registry.get("mypack.wait")
    assert waited is not None
    assert waited.metadata["async"] is True
    assert waited.metadata["timeout"] == 3
    assert waited.description == "custom"
    assert [d.ref for d in registry] == ["mypack.greet", "mypack.wait"]


@pytest.mark.parametrize("ref", ["noperiod", ".name", "pack.", "pa ck.name", "pack/x.name", ""])
def test_registry_refuses_bad_refs(ref: str) -> None:
    registry = ActionRegistry()
    with pytest.raises(ValueError, match=r"must look like pack\.name"):
        registry.action(ref)(lambda: None)
    assert len(registry) == 0


def test_registry_refuses_invalid_schema_and_conflicting_duplicates() -> None:
    registry = ActionRegistry()
    with pytest.raises(jsonschema.SchemaError):
        registry.add(ActionDefinition("p.bad", "python", "python", {"type": "no-such-type"}))
    first = ActionDefinition("p.a", "python", "python", {"type": "object"})
    registry.add(first)
    registry.add(ActionDefinition("p.a", "python", "python", {"type": "object"}))  # identical: fine
    with pytest.raises(ValueError, match="registered twice"):
        registry.add(ActionDefinition("p.a", "python", "python", {"type": "object", "required": ["x"]}))
    assert registry.get("p.a") == first


def test_subprocess_action_registration() -> None:
    registry = ActionRegistry()
    definition = registry.subprocess_action("ops.ls", argv=["ls", "-l"])
    assert definition.runner_type == "subprocess"
    assert definition.runtime == "shell"
    assert definition.metadata["argv"] == ["ls", "-l"]
    assert definition.metadata["shell"] is False
    with pytest.raises(ValueError, match="either argv or shell"):
        registry.subprocess_action("ops.both", argv=["x"], shell=True, command_parameter="cmd")
    with pytest.raises(ValueError, match="either argv or shell"):
        registry.subprocess_action("ops.neither")
    with pytest.raises(ValueError, match="needs command_parameter"):
        registry.subprocess_action("ops.sh", shell=True)


def test_core_pack() -> None:
    refs = [d.ref for d in core]
    assert refs == ["core.echo", "core.local", "core.noop", "core.sleep"]
    for definition in core:
        jsonschema.Draft202012Validator.check_schema(definition.parameters_schema)


def test_registry_refuses_a_ref_with_a_final_newline() -> None:
    with pytest.raises(ValueError, match=r"must look like pack\.name"):
        ActionRegistry().action("pack.name\n")(lambda: None)
