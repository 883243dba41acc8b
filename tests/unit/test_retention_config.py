"""retention.* settings (issue #14): ages as seconds or text, "off" keeps a status for
good, defaults keep successes a week and failures a month, and bad values are refused in
one line naming the key. Also the CLI's age and status checks (domain/retention.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.config import Settings, load_settings
from conveyor.domain.errors import ConveyorError
from conveyor.domain.retention import RetentionError, check_statuses, parse_age

DAY = 86_400.0


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("CONVEYOR") or name in ("DATABASE_URL", "DATABASE_DIRECT_URL"):
            monkeypatch.delenv(name)


def test_defaults_keep_successes_a_week_and_failures_a_month() -> None:
    r = Settings().retention
    assert r.policy() == {
        "completed": 7 * DAY,
        "cancelled": 7 * DAY,
        "failed": 30 * DAY,
        "timeout": 30 * DAY,
        "abandoned": 30 * DAY,
    }
    assert (r.interval, r.batch_size, r.max_batches) == (60, 1000, 100)


def test_the_file_and_the_environment_take_ages_and_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "conveyor.yaml"
    path.write_text("retention:\n  completed: 12h\n  failed: null\n  timeout: 3600\n  batch_size: 50\n")
    monkeypatch.setenv("CONVEYOR__RETENTION__ABANDONED", "off")
    monkeypatch.setenv("CONVEYOR__RETENTION__CANCELLED", "2w")
    r = load_settings(path).settings.retention
    assert r.policy() == {"completed": 12 * 3600, "cancelled": 14 * DAY, "timeout": 3600}
    assert r.batch_size == 50


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("completed", "soon", "retention.completed"),
        ("failed", "-5", "retention.failed"),
        ("batch_size", "0", "retention.batch_size"),
        ("interval", "0", "retention.interval"),
    ],
)
def test_bad_values_name_their_key(monkeypatch: pytest.MonkeyPatch, key: str, value: str, message: str) -> None:
    monkeypatch.setenv(f"CONVEYOR__RETENTION__{key.upper()}", value)
    with pytest.raises(ConveyorError, match=message):
        load_settings()


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("1.5h", 5400), ("30d", 30 * DAY), ("2w", 14 * DAY)]
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1d", "1d2h", "d"])
def test_bad_ages(text: str) -> None:
    with pytest.raises(RetentionError, match="not an age"):
        parse_age(text)


def test_only_finished_statuses_can_be_purged() -> None:
    assert check_statuses(["failed", "timeout", "failed"]) == ["failed", "timeout"]
    with pytest.raises(RetentionError, match="not running, requested"):
        check_statuses(["completed", "running", "requested"])
