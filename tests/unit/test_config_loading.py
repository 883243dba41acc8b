"""Pure unit tests: loading configuration from files and the environment (the message queue
settings among them). No database, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.config import ENV_PREFIX, load_settings
from conveyor.domain.errors import ConveyorError

# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name in ("DATABASE_URL", "DATABASE_DIRECT_URL", "CONVEYOR_CONFIG"):
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
