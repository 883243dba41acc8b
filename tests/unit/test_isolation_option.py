"""The ``isolation`` option of an action and of the worker, and which actions a child process
can import by name (runners/isolated.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from conveyor.actions.registry import ActionDefinition, ActionRegistry
from conveyor.config import Settings
from conveyor.worker.runners.isolated import Lease, entry_point


def top_level() -> None:
    return None


def test_isolation_is_stored_in_the_action_metadata() -> None:
    registry = ActionRegistry()
    registry.action("t.proc", isolation="process")(top_level)
    registry.action("t.plain")(top_level)
    proc, plain = registry.get("t.proc"), registry.get("t.plain")
    assert proc is not None
    assert plain is not None
    assert proc.metadata["isolation"] == "process"
    assert "isolation" not in plain.metadata  # the worker's setting decides
    assert entry_point(proc) == f"{__name__}:top_level"


def test_isolation_process_needs_a_function_importable_by_name() -> None:
    registry = ActionRegistry()

    def local() -> None:
        return None

    with pytest.raises(ValueError, match="importable by name"):
        registry.action("t.local", isolation="process")(local)
    registry.action("t.local_thread", isolation="thread")(local)
    definition = registry.get("t.local_thread")
    assert definition is not None
    assert entry_point(definition) is None  # the worker's isolation=process cannot run it: it says so


@pytest.mark.parametrize("value", ["processes", "fork", ""])
def test_unknown_isolation_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="isolation must be"):
        ActionRegistry().action("t.x", isolation=value)


def test_entry_points_a_child_cannot_import() -> None:
    def definition(name: object) -> ActionDefinition:
        return ActionDefinition("t.x", "python", "python", {"type": "object"}, metadata={"entry_point": name})

    assert entry_point(definition("__main__:f")) is None
    assert entry_point(definition("m:f.<locals>.g")) is None
    assert entry_point(definition(None)) is None
    assert entry_point(definition("pkg.mod:Cls.method")) == "pkg.mod:Cls.method"


def test_worker_isolation_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().worker.isolation == "thread"
    monkeypatch.setenv("CONVEYOR__WORKER__ISOLATION", "process")
    assert Settings().worker.isolation == "process"
    monkeypatch.setenv("CONVEYOR__WORKER__ISOLATION", "forked")
    with pytest.raises(ValueError, match="isolation"):
        Settings()


def test_lease_renew_and_expire() -> None:
    lease = Lease(2.0)
    assert lease.deadline.value > time.monotonic()
    lease.renew(100.0)
    assert lease.deadline.value == 102.0
    lease.expire()
    assert lease.deadline.value < time.monotonic()
