"""Configuration: the seeds' own configuration blocks load (with their meaning, through
documented aliases), unknown keys in the file or in ``CONVEYOR__`` variables are refused
with one line naming them, a database URL psycopg cannot use is refused, and
``config show`` masks every form of password."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.config import Settings, load_settings
from conveyor.config.keys import mask_secrets
from conveyor.domain.errors import ConveyorError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets (the suite's own environment may carry some)."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("CONVEYOR") or name in ("DATABASE_URL", "DATABASE_DIRECT_URL"):
            monkeypatch.delenv(name)


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conveyor.yaml"
    path.write_text(text)
    return path


# Seed 000, "Recommended Timeouts", as written there.
SEED_000 = """
executor:
  # How long an execution can stay SCHEDULED before failing
  scheduled_timeout: 300 # 5 minutes
  # How often to check for stale executions
  timeout_check_interval: 60 # 1 minute
  # Message TTL in worker queues
  worker_queue_ttl: 300 # 5 minutes (match scheduled_timeout)
  # Worker health check interval
  health_check_interval: 30 # 30 seconds
worker:
  # How often to send heartbeats
  heartbeat_interval: 10 # 10 seconds (more frequent)
  # Grace period for shutdown
  shutdown_timeout: 30 # 30 seconds
"""

# Seed 002 / Attune: dead_letter nested under message_queue.rabbitmq.
SEED_002 = """
message_queue:
  rabbitmq:
    worker_queue_ttl_ms: 300000 # 5 minutes
    dead_letter:
      enabled: true
      exchange: attune.dlx
      ttl_ms: 86400000 # 24 hours
"""


def test_the_seeds_recommended_block_loads_with_its_meaning(tmp_path: Path) -> None:
    loaded = load_settings(config(tmp_path, SEED_000))
    s = loaded.settings
    assert (s.executor.scheduled_timeout, s.executor.timeout_check_interval) == (300, 60)
    assert s.message_queue.rabbitmq.worker_queue_ttl_ms == 300_000  # seconds -> ms
    assert s.recovery.sweep_interval == 30
    assert (s.worker.heartbeat_interval, s.worker.shutdown_timeout, s.worker.staleness) == (10, 30, 30)
    path = tmp_path / "conveyor.yaml"
    assert loaded.sources["message_queue.rabbitmq.worker_queue_ttl_ms"] == f"file {path} (as executor.worker_queue_ttl)"
    assert loaded.sources["recovery.sweep_interval"] == f"file {path} (as executor.health_check_interval)"


def test_attunes_dead_letter_nesting_loads(tmp_path: Path) -> None:
    s = load_settings(config(tmp_path, SEED_002)).settings
    assert s.message_queue.rabbitmq.worker_queue_ttl_ms == 300_000
    assert (s.dead_letter.enabled, s.dead_letter.exchange, s.dead_letter.ttl_ms) == (True, "attune.dlx", 86_400_000)
    assert s.dead_letter_exchange == "attune.dlx"


def test_aliases_work_in_the_environment_and_override_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR__EXECUTOR__WORKER_QUEUE_TTL", "12.5")
    monkeypatch.setenv("CONVEYOR__MESSAGE_QUEUE__RABBITMQ__DEAD_LETTER__ENABLED", "false")
    without_ms = SEED_002.replace("    worker_queue_ttl_ms: 300000 # 5 minutes\n", "")
    loaded = load_settings(config(tmp_path, SEED_000 + without_ms))
    assert loaded.settings.message_queue.rabbitmq.worker_queue_ttl_ms == 12_500
    assert loaded.settings.dead_letter.enabled is False
    assert loaded.sources["dead_letter.enabled"] == "env CONVEYOR__MESSAGE_QUEUE__RABBITMQ__DEAD_LETTER__ENABLED"


def test_aliases_in_code() -> None:
    s = Settings(executor={"worker_queue_ttl": 2}, message_queue={"rabbitmq": {"dead_letter": {"ttl_ms": 5000}}})  # type: ignore[arg-type]
    assert (s.message_queue.rabbitmq.worker_queue_ttl_ms, s.dead_letter.ttl_ms) == (2000, 5000)


def test_an_alias_and_its_key_set_differently_is_refused(tmp_path: Path) -> None:
    text = "executor:\n  worker_queue_ttl: 300\nmessage_queue:\n  rabbitmq:\n    worker_queue_ttl_ms: 1000\n"
    both = r"executor.worker_queue_ttl and message_queue.rabbitmq.worker_queue_ttl_ms are both set"
    with pytest.raises(ConveyorError, match=both):
        load_settings(config(tmp_path, text))
    same = text.replace("1000", "300000")
    assert load_settings(config(tmp_path, same)).settings.message_queue.rabbitmq.worker_queue_ttl_ms == 300_000


def test_a_bad_alias_value_names_the_key(tmp_path: Path) -> None:
    path = config(tmp_path, "executor:\n  worker_queue_ttl: soon\n")
    with pytest.raises(ConveyorError) as raised:
        load_settings(path)
    assert str(raised.value) == (
        f"invalid configuration: executor.worker_queue_ttl in config file {path}: 'soon' is not a number of seconds"
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("CONVEYOR__WORKERS__NAME", "unknown setting CONVEYOR__WORKERS__NAME (did you mean CONVEYOR__WORKER__NAME?)"),
        ("CONVEYOR__TRANSPORTT", "unknown setting CONVEYOR__TRANSPORTT (did you mean CONVEYOR__TRANSPORT?)"),
        ("CONVEYOR__EXECUTOR__HEARTBEAT_INTERVAL",
         "unknown setting CONVEYOR__EXECUTOR__HEARTBEAT_INTERVAL (did you mean CONVEYOR__WORKER__HEARTBEAT_INTERVAL?)"),
        ("CONVEYOR__WORKER__NAME__FIRST", "unknown setting CONVEYOR__WORKER__NAME__FIRST"),
        ("CONVEYOR__ZZZ", "unknown setting CONVEYOR__ZZZ"),
    ],
)  # fmt: skip
def test_unknown_environment_keys_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, message: str) -> None:
    monkeypatch.setenv(name, "5")
    with pytest.raises(ConveyorError) as raised:
        load_settings()
    assert str(raised.value) == f"invalid configuration: {message}"


def test_known_environment_keys_and_other_variables_are_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR__MESSAGE_QUEUE__RABBITMQ__PREFETCH", "7")
    monkeypatch.setenv("CONVEYOR__WORKER", '{"name": "w-json"}')  # a whole section, as JSON
    monkeypatch.setenv("CONVEYOR_SERVICE_HOST", "10.0.0.1")  # Kubernetes' kind: not ours
    s = load_settings().settings
    assert (s.message_queue.rabbitmq.prefetch, s.worker.name) == (7, "w-json")


def test_unknown_file_keys_are_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = config(tmp_path, "executor:\n  batch_sise: 3\n  heartbeat_interval: 4\nworkers:\n  name: x\n")
    with pytest.raises(ConveyorError) as raised:
        load_settings(path)
    assert str(raised.value) == (
        f"invalid configuration: unknown key executor.batch_sise in config file {path} (did you mean "
        f"executor.batch_size?); unknown key executor.heartbeat_interval in config file {path} (did you mean "
        f"worker.heartbeat_interval?); unknown key workers in config file {path} (did you mean worker?)"
    )


@pytest.mark.parametrize(
    "url", ["mysql://u:secret@h/db", "sqlite:///x.db", "postgresql+psycopg://u:secret@h/db", "just-a-word"]
)
def test_a_database_url_that_is_not_postgresql_is_one_line(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(ConveyorError) as raised:
        load_settings()
    message = str(raised.value)
    assert message.startswith("invalid configuration: DATABASE_URL: "), message
    assert "PostgreSQL URL" in message
    assert "secret" not in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "url", ["postgresql://u:p@h:5432/db", "postgres://h/db?sslmode=require", "host=h dbname=db user=u", ""]
)
def test_postgresql_urls_and_conninfo_are_accepted(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("CONVEYOR__DATABASE__URL", url)
    assert load_settings().settings.database.url == (url or None)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:secret@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?sslmode=require&password=secret", "postgresql://u@h/db?sslmode=require&password=***"),
        ("postgresql://h/db?password=secret", "postgresql://h/db?password=***"),
        ("host=h password=secret dbname=db", "host=h password=*** dbname=db"),
        ("host=h password = 'se cret' dbname=db", "host=h password = *** dbname=db"),
        ("amqp://guest:secret@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("postgresql://u:se/cr?et@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("host=h password=:// dbname=db", "host=h password=*** dbname=db"),  # found by the property below
        # issue #25: the client key's passphrase, and keys libpq percent-decodes, were shown.
        ("postgresql://h/db?sslpassword=secret", "postgresql://h/db?sslpassword=***"),
        ("postgresql://h/db?pass%77ord=secret&sslmode=require", "postgresql://h/db?pass%77ord=***&sslmode=require"),
        ("postgresql://h/db?%73%73%6Cpassword=secret", "postgresql://h/db?%73%73%6Cpassword=***"),
        ("host=h sslpassword='se cret' sslkey=/k.pem", "host=h sslpassword=*** sslkey=/k.pem"),
        ("postgresql://h/db?sslkey=/k.pem&passfile=/p", "postgresql://h/db?sslkey=/k.pem&passfile=/p"),
    ],
)
def test_passwords_are_masked(url: str, masked: str) -> None:
    assert mask_secrets(url) == masked


def _spelled(key: str, encoded: list[bool], upper: list[bool]) -> str:
    """``key`` as a URL may spell it: any character percent-encoded, any letter upper case."""
    chars = [c.upper() if up else c for c, up in zip(key, upper, strict=False)] + list(key[len(upper) :])
    return "".join(f"%{ord(c):02X}" if enc else c for c, enc in zip(chars, encoded + [False] * len(key), strict=False))


SECRET = st.text(st.characters(blacklist_characters="&#'\\ \t\n\r\x0b\x0c"), min_size=1, max_size=20)
FLAGS = st.lists(st.booleans(), max_size=11)


@given(SECRET, st.sampled_from(["password", "sslpassword"]), FLAGS, FLAGS)
def test_no_secret_query_parameter_survives_masking(
    secret: str, key: str, encoded: list[bool], upper: list[bool]
) -> None:
    """?password=, ?sslpassword=, however the key is spelled (pass%77ord, PassWord)."""
    spelled = _spelled(key, encoded, upper)
    url = f"postgresql://h/db?sslmode=require&{spelled}={secret}&application_name=x"
    assert mask_secrets(url) == f"postgresql://h/db?sslmode=require&{spelled}=***&application_name=x"
    assert mask_secrets(f"host=h {key}={secret} dbname=x") == f"host=h {key}=*** dbname=x"


@given(SECRET)
def test_no_password_survives_masking(secret: str) -> None:
    for template, masked in [
        ("postgresql://u:{}@h/db", "postgresql://u:***@h/db"),
        ("postgresql://h/db?password={}", "postgresql://h/db?password=***"),
        ("host=h password={} dbname=x", "host=h password=*** dbname=x"),
        ("host=h password='{}' dbname=x", "host=h password=*** dbname=x"),
    ]:
        assert mask_secrets(template.format(secret)) == masked
