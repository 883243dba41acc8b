"""``conveyor config show``: a setting left unset whose value the services compute is shown
with that value and source ``computed``, from the functions the services call."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from conveyor.cli import config_cmd
from conveyor.cli.config_cmd import effective
from conveyor.config import Settings
from conveyor.domain.errors import DatabaseUnavailableError
from conveyor.service import embedded
from conveyor.worker.naming import default_worker_name


@pytest.fixture(autouse=True)
def _no_embedded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):  # the settings come from the test, not the environment
        if name.startswith("CONVEYOR") or name in ("DATABASE_URL", "DATABASE_DIRECT_URL"):
            monkeypatch.delenv(name)

    def not_running(settings: Settings) -> str:
        raise DatabaseUnavailableError("no database")

    monkeypatch.setattr(embedded, "find_running", not_running)


def test_unset_settings_show_their_computed_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: the per-user data dir
    settings = Settings(message_queue={"prefix": "attune"}, worker={"max_concurrent_tasks": 3})
    shown = effective(settings, {})
    assert shown["worker.name"] == (f"{socket.gethostname()}-<pid>", "computed")
    assert shown["worker.prefetch"] == (8, "computed")  # at least 8
    assert shown["dead_letter.exchange"] == ("attune.dlx", "computed")
    data_dir, source = shown["embedded.data_dir"]
    assert (Path(data_dir).name, source) == ("pgdata", "computed")
    assert shown["database.url"] == (None, "default")  # the embedded server does not run
    assert shown["health.port"] == (None, "default")  # unset means off: nothing computed
    assert shown["executor.batch_size"] == (100, "default")


def test_set_settings_keep_their_value_and_source(tmp_path: Path) -> None:
    settings = Settings(
        worker={"name": "w1", "prefetch": 0},
        dead_letter={"exchange": "dlx"},
        embedded={"data_dir": str(tmp_path)},
        database={"url": "postgresql://u:secret@db/conveyor"},
    )
    sources = {"worker.name": "env CONVEYOR__WORKER__NAME", "database.url": "env DATABASE_URL"}
    shown = effective(settings, sources)
    assert shown["worker.name"] == ("w1", "env CONVEYOR__WORKER__NAME")
    assert shown["worker.prefetch"] == (0, "default")
    assert shown["dead_letter.exchange"] == ("dlx", "default")
    assert shown["embedded.data_dir"] == (str(tmp_path), "default")
    assert shown["database.url"] == ("postgresql://u:***@db/conveyor", "env DATABASE_URL")


def test_the_running_embedded_server_url_is_computed_and_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "find_running", lambda settings: "postgresql://me:pw@/postgres?host=/run/pg")
    assert effective(Settings(), {})["database.url"] == ("postgresql://me:***@/postgres?host=/run/pg", "computed")


def test_the_worker_default_name_is_the_services_own() -> None:
    assert default_worker_name() == f"{socket.gethostname()}-{os.getpid()}"
    assert config_cmd.computed(Settings())["worker.name"] == default_worker_name(config_cmd.PID_PLACEHOLDER)
