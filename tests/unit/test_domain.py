"""Pure unit tests: the transition graph, placement, configuration, the action
registry and the CLI parameter parser. No database, no processes."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conveyor.actions.core import core
from conveyor.actions.registry import ActionDefinition, ActionRegistry, schema_from_signature
from conveyor.cli.run import parse_parameters
from conveyor.config import ENV_PREFIX, load_settings
from conveyor.domain.errors import ConveyorError
from conveyor.domain.status import (
    ON_WORKER,
    TERMINAL,
    TRANSITIONS,
    ExecutionStatus,
    can_transition,
    edges,
)
from conveyor.executor.placement import Candidate, Claim, place

S = ExecutionStatus

# ---------------------------------------------------------------------------
# The transition graph
# ---------------------------------------------------------------------------


def test_every_status_has_an_entry_in_the_graph() -> None:
    assert set(TRANSITIONS) == set(ExecutionStatus)
    for targets in TRANSITIONS.values():
        assert targets <= set(ExecutionStatus)


def test_terminal_statuses_have_no_exits() -> None:
    assert {S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.ABANDONED} == TERMINAL
    for status in TERMINAL:
        assert status.is_terminal
        assert TRANSITIONS[status] == frozenset()
        assert not any(can_transition(status, target) for target in ExecutionStatus)


def test_non_terminal_statuses_have_exits() -> None:
    for status in set(ExecutionStatus) - TERMINAL:
        assert not status.is_terminal
        assert TRANSITIONS[status], f"{status} is a dead end but not terminal"


def test_every_status_is_reachable_from_requested() -> None:
    seen = {S.REQUESTED}
    queue = deque([S.REQUESTED])
    while queue:
        for nxt in TRANSITIONS[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    assert seen == set(ExecutionStatus)


def test_every_non_terminal_status_can_reach_a_terminal_one() -> None:
    """Nothing can be stuck forever by construction of the graph."""
    for start in ExecutionStatus:
        seen, queue = {start}, deque([start])
        while queue:
            for nxt in TRANSITIONS[queue.popleft()]:
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        assert seen & TERMINAL, f"no terminal status reachable from {start}"


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        (S.REQUESTED, S.SCHEDULING, True),
        (S.REQUESTED, S.CANCELLED, True),
        (S.REQUESTED, S.SCHEDULED, False),  # must be claimed first
        (S.REQUESTED, S.RUNNING, False),
        (S.SCHEDULING, S.SCHEDULED, True),
        (S.SCHEDULING, S.REQUESTED, True),  # claim handed back
        (S.SCHEDULED, S.RUNNING, True),
        (S.SCHEDULED, S.REQUESTED, True),  # dispatch lost before start
        (S.SCHEDULED, S.COMPLETED, False),
        (S.RUNNING, S.COMPLETED, True),
        (S.RUNNING, S.REQUESTED, True),  # worker lost mid-run, retry allowed
        (S.RUNNING, S.SCHEDULED, False),
        (S.RUNNING, S.CANCELLED, False),  # through canceling
        (S.CANCELING, S.CANCELLED, True),
        (S.CANCELING, S.RUNNING, False),
        (S.COMPLETED, S.REQUESTED, False),
        (S.FAILED, S.RUNNING, False),
        (S.REQUESTED, S.REQUESTED, False),  # not an edge (the DB treats a same-status write as no change)
    ],
)
def test_can_transition(source: ExecutionStatus, target: ExecutionStatus, allowed: bool) -> None:
    assert can_transition(source, target) is allowed


def test_edges_match_transitions() -> None:
    expected = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges() == expected
    assert all(isinstance(a, str) and isinstance(b, str) for a, b in edges())
    assert len(edges()) == 18


def test_on_worker_statuses() -> None:
    assert {S.SCHEDULED, S.RUNNING, S.CANCELING} == ON_WORKER
    assert not (ON_WORKER & TERMINAL)


# ---------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------

PY_ACTIONS = ("core.echo", "core.noop", "core.sleep")


def py_claim(i: int, ref: str = "core.echo") -> Claim:
    return Claim(id=i, action_ref=ref, runner_type="python", runtime="python", age=0.0)


def sh_claim(i: int, ref: str = "core.local") -> Claim:
    return Claim(id=i, action_ref=ref, runner_type="subprocess", runtime="shell", age=0.0)


def worker(
    wid: int,
    *,
    capacity: int = 10,
    load: int = 0,
    runtimes: tuple[str, ...] = ("python", "shell"),
    actions: tuple[str, ...] = PY_ACTIONS,
) -> Candidate:
    return Candidate(id=wid, runtimes=list(runtimes), actions=list(actions), capacity=capacity, load=load)


def test_least_loaded_worker_wins_not_the_first() -> None:
    busy, idle = worker(1, load=5), worker(2, load=0)
    result = place([py_claim(100)], [busy, idle])
    assert result.assigned == [(100, 2)]
    assert not result.no_capacity
    assert not result.no_worker


def test_load_is_relative_to_capacity() -> None:
    # 3 of 4 slots taken (75 %) is busier than 5 of 20 (25 %).
    small, big = worker(1, capacity=4, load=3), worker(2, capacity=20, load=5)
    assert place([py_claim(1)], [small, big]).assigned == [(1, 2)]


def test_claims_spread_across_workers() -> None:
    a, b = worker(1), worker(2)
    result = place([py_claim(i) for i in range(6)], [a, b])
    per_worker = {1: 0, 2: 0}
    for _, wid in result.assigned:
        per_worker[wid] += 1
    assert per_worker == {1: 3, 2: 3}
    assert a.load == 3
    assert b.load == 3


def test_ties_broken_by_worker_id() -> None:
    result = place([py_claim(1)], [worker(7), worker(3), worker(5)])
    assert result.assigned == [(1, 3)]


def test_capacity_respected() -> None:
    a, b = worker(1, capacity=2), worker(2, capacity=1, load=1)
    result = place([py_claim(i) for i in range(5)], [a, b])
    assert result.assigned == [(0, 1), (1, 1)]
    assert result.no_capacity == [2, 3, 4]
    assert result.no_worker == []
    assert a.load == 2
    assert b.load == 1


def test_overloaded_worker_gets_nothing() -> None:
    # Load above capacity (capacity lowered on re-registration): no free slot.
    result = place([py_claim(1)], [worker(1, capacity=2, load=5)])
    assert result.no_capacity == [1]


def test_python_actions_only_go_to_workers_listing_them() -> None:
    lacks = worker(1, actions=("core.noop",))
    has = worker(2, load=9)
    result = place([py_claim(1, "core.echo")], [lacks, has])
    assert result.assigned == [(1, 2)]
    # The python runtime alone is not enough.
    result = place([py_claim(2, "mypack.thing")], [worker(1), worker(2)])
    assert result.no_worker == [2]


def test_subprocess_actions_go_to_any_worker_with_the_runtime() -> None:
    no_shell = worker(1, runtimes=("python",), actions=())
    shell = worker(2, runtimes=("shell",), actions=(), load=3)
    result = place([sh_claim(1)], [no_shell, shell])
    assert result.assigned == [(1, 2)]
    # Not listed in any worker's actions, yet placed: subprocess actions are data.
    assert place([sh_claim(2, "ops.custom")], [worker(3, actions=())]).assigned == [(2, 3)]
    assert place([sh_claim(3)], [no_shell]).no_worker == [3]


def test_no_worker_versus_no_capacity() -> None:
    full = worker(1, capacity=1, load=1)
    result = place([py_claim(1, "core.echo"), py_claim(2, "other.action")], [full])
    assert result.no_capacity == [1]
    assert result.no_worker == [2]
    assert result.assigned == []
    empty = place([py_claim(3)], [])
    assert empty.no_worker == [3]
    assert empty.no_capacity == []
    assert empty.assigned == []


def test_place_keeps_claim_order_and_mixes_kinds() -> None:
    claims = [py_claim(1), sh_claim(2), py_claim(3, "x.unknown"), py_claim(4)]
    result = place(claims, [worker(1, capacity=2), worker(2, capacity=1, runtimes=("shell",), actions=())])
    assert [eid for eid, _ in result.assigned] == [1, 2, 4]
    assert result.no_worker == [3]
    assigned = dict(result.assigned)
    assert assigned[1] == 1
    assert assigned[4] == 1


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name in ("DATABASE_URL", "CONVEYOR_CONFIG"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_match_the_seeds(clean_env: pytest.MonkeyPatch) -> None:
    loaded = load_settings()
    s = loaded.settings
    assert s.worker.heartbeat_interval == 10
    assert s.worker.heartbeat_staleness_multiplier == 3
    assert s.worker.staleness == 30
    assert s.executor.scheduled_timeout == 300
    assert s.executor.timeout_check_interval == 60
    assert s.worker.shutdown_timeout == 30
    assert s.database.url is None
    assert s.database.schema_name == "conveyor"
    assert loaded.config_file is None
    assert set(loaded.sources.values()) == {"default"}
    assert loaded.sources["worker.heartbeat_interval"] == "default"


def test_yaml_file_and_env_override_with_sources(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "conveyor.yaml"
    config.write_text(
        "executor:\n  scheduled_timeout: 120\n"
        "worker:\n  heartbeat_interval: 20\n  shutdown_timeout: 5\n"
        "database:\n  schema: other_schema\n",
        encoding="utf-8",
    )
    clean_env.setenv("CONVEYOR__WORKER__HEARTBEAT_INTERVAL", "3")
    loaded = load_settings(config)
    s = loaded.settings
    assert s.worker.heartbeat_interval == 3  # env beats file
    assert s.worker.shutdown_timeout == 5  # file beats default
    assert s.executor.scheduled_timeout == 120
    assert s.executor.timeout_check_interval == 60  # default
    assert s.database.schema_name == "other_schema"
    assert loaded.config_file == config
    src = loaded.sources
    assert src["worker.heartbeat_interval"] == "env CONVEYOR__WORKER__HEARTBEAT_INTERVAL"
    assert src["worker.shutdown_timeout"] == f"file {config}"
    assert src["executor.scheduled_timeout"] == f"file {config}"
    assert src["database.schema"] == f"file {config}"
    assert src["executor.timeout_check_interval"] == "default"


def test_config_file_from_conveyor_config_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("worker:\n  heartbeat_interval: 7\n", encoding="utf-8")
    clean_env.setenv("CONVEYOR_CONFIG", str(config))
    loaded = load_settings()
    assert loaded.settings.worker.heartbeat_interval == 7
    assert loaded.sources["worker.heartbeat_interval"] == f"file {config}"


def test_empty_yaml_file_is_all_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "empty.yaml"
    config.write_text("", encoding="utf-8")
    loaded = load_settings(config)
    assert loaded.settings.worker.heartbeat_interval == 10
    assert set(loaded.sources.values()) == {"default"}


def test_database_url_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("database:\n  url: postgresql://file/db\n", encoding="utf-8")
    assert load_settings(config).settings.database.url == "postgresql://file/db"
    clean_env.setenv("DATABASE_URL", "postgresql://env/db")
    loaded = load_settings(config)
    assert loaded.settings.database.url == "postgresql://env/db"
    assert loaded.sources["database.url"] == "env DATABASE_URL"
    # DATABASE_URL wins over the CONVEYOR__ form as well.
    clean_env.setenv("CONVEYOR__DATABASE__URL", "postgresql://prefixed/db")
    assert load_settings(config).settings.database.url == "postgresql://env/db"
    clean_env.delenv("DATABASE_URL")
    loaded = load_settings(config)
    assert loaded.settings.database.url == "postgresql://prefixed/db"
    assert loaded.sources["database.url"] == "env CONVEYOR__DATABASE__URL"


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("worker:\n  heartbeat_interval: -1\n", "worker.heartbeat_interval"),
        ("worker:\n  heartbeat_interval: often\n", "worker.heartbeat_interval"),
        ("executor:\n  scheduled_timeout: 0\n", "executor.scheduled_timeout"),
        ("worker:\n  heartbeat_intervall: 5\n", "heartbeat_intervall"),  # typo: unknown keys refused
        ("nonsense: 1\n", "nonsense"),
        ("database:\n  schema: Bad-Name\n", "database.schema"),
        ("log:\n  level: verbose\n", "log.level"),
    ],
)
def test_invalid_file_values_give_a_clear_conveyor_error(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, yaml_text: str, fragment: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(ConveyorError, match="invalid configuration") as info:
        load_settings(config)
    assert fragment in str(info.value)


def test_invalid_env_value_gives_a_clear_conveyor_error(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CONVEYOR__WORKER__HEARTBEAT_INTERVAL", "soon")
    with pytest.raises(ConveyorError, match=r"invalid configuration: worker\.heartbeat_interval"):
        load_settings()


def test_invalid_env_list_value_gives_a_conveyor_error(clean_env: pytest.MonkeyPatch) -> None:
    # A list field set from the environment must be JSON; a bare word is a user error,
    # not a traceback.
    clean_env.setenv("CONVEYOR__WORKER__RUNTIMES", "python")
    with pytest.raises(ConveyorError, match="invalid configuration") as info:
        load_settings()
    assert "worker" in str(info.value)
    clean_env.setenv("CONVEYOR__WORKER__RUNTIMES", '["shell"]')
    assert load_settings().settings.worker.runtimes == ["shell"]


def test_bad_config_files(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConveyorError, match="cannot read config file"):
        load_settings(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("worker: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConveyorError, match="not valid YAML"):
        load_settings(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("- just\n- a list\n", encoding="utf-8")
    with pytest.raises(ConveyorError, match="must hold a mapping"):
        load_settings(scalar)


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


def test_message_queue_settings_from_the_seeds_layout(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The seeds' YAML layout is read and applied (their system ignored it)."""
    config = tmp_path / "mq.yaml"
    config.write_text(
        "transport: rabbitmq\n"
        "message_queue:\n  url: amqp://u:p@mq:5672/v\n  rabbitmq:\n    worker_queue_ttl_ms: 120000\n"
        "dead_letter:\n  enabled: true\n  exchange: attune.dlx\n  ttl_ms: 172800000\n",
        encoding="utf-8",
    )
    clean_env.setenv("CONVEYOR__MESSAGE_QUEUE__RABBITMQ__PREFETCH", "7")
    loaded = load_settings(config)
    s = loaded.settings
    assert s.transport == "rabbitmq"
    assert s.message_queue.url == "amqp://u:p@mq:5672/v"
    assert s.message_queue.rabbitmq.worker_queue_ttl_ms == 120_000
    assert s.message_queue.rabbitmq.prefetch == 7
    assert s.dead_letter_exchange == "attune.dlx"
    assert s.dead_letter.ttl_ms == 172_800_000
    assert loaded.sources["message_queue.rabbitmq.prefetch"] == "env CONVEYOR__MESSAGE_QUEUE__RABBITMQ__PREFETCH"


def test_message_queue_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = load_settings().settings
    assert s.transport == "postgres"
    assert s.message_queue.prefix == "conveyor"
    assert s.message_queue.rabbitmq.worker_queue_ttl_ms == 300_000
    assert s.dead_letter.ttl_ms == 86_400_000
    assert s.dead_letter_exchange == "conveyor.dlx"


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("transport: kafka\n", "transport"),
        ("message_queue:\n  rabbitmq:\n    worker_queue_ttl_ms: 3000000000\n", "worker_queue_ttl_ms"),
        ("message_queue:\n  rabbitmq:\n    worker_queue_ttl_ms: 5000\n    worker_queue_expires_ms: 4000\n",
         "worker_queue_expires_ms must be longer"),
        ("message_queue:\n  prefix: 'a b'\n", "message_queue.prefix"),
    ],
)  # fmt: skip
def test_bad_message_queue_settings_are_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, yaml_text: str, fragment: str
) -> None:
    from conveyor.domain.errors import ConveyorError

    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(ConveyorError, match=fragment):
        load_settings(config)
