"""Pure unit tests: the connection-pooler settings (database.direct_url, database.pooler,
database.prepared_statements) and what they make of the connection parameters. No
database, no processes (tests/acceptance/test_pgbouncer.py runs them through PgBouncer)."""

from __future__ import annotations

import os
import re

import psycopg
import pytest

from conveyor.cli.config_cmd import effective
from conveyor.config import DatabaseSettings, Settings, load_settings
from conveyor.domain.errors import ConveyorError
from conveyor.store.db import PROCESS_TAG, conninfo_kwargs, pooler_hint, tagged

# The sweep's pattern for a process tag (recovery.sql, deactivate_dead_workers).
SWEEP_TAG = re.compile(r"\[([0-9a-f]{12})\]")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith("CONVEYOR") or name in ("DATABASE_URL", "DATABASE_DIRECT_URL"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("pooler", "prepared", "threshold"),
    [
        ("none", None, 5),  # psycopg's default
        ("transaction", None, None),  # behind a transaction pooler: never prepare
        ("transaction", True, 5),  # PgBouncer >= 1.21 with max_prepared_statements
        ("none", False, None),
    ],
)
def test_prepare_threshold_follows_the_pooler(pooler: str, prepared: bool | None, threshold: int | None) -> None:
    db = DatabaseSettings.model_validate(
        {"url": "postgresql://h/db", "direct_url": "postgresql://d/db", "pooler": pooler,
         "prepared_statements": prepared}
    )  # fmt: skip
    assert db.prepare_threshold == threshold


def test_pooled_connections_send_no_options_and_no_sweep_tag() -> None:
    direct = conninfo_kwargs("conveyor", "conveyor-worker")
    assert "search_path=conveyor" in direct["options"]
    assert SWEEP_TAG.search(direct["application_name"]).group(1) == PROCESS_TAG  # type: ignore[union-attr]

    pooled = conninfo_kwargs("conveyor", "conveyor-worker", pooled=True)
    assert "options" not in pooled  # PgBouncer refuses it: "unsupported startup parameter: options"
    assert pooled["application_name"] == f"conveyor-worker <{PROCESS_TAG}>"
    assert SWEEP_TAG.search(pooled["application_name"]) is None  # never evidence that the process lives
    assert pooled["keepalives"] == 1


def test_a_long_name_keeps_its_tag_within_postgresql_63_bytes() -> None:
    for pooled in (False, True):
        name = tagged("x" * 100, pooled=pooled)
        assert len(name.encode()) == 63
        assert name.endswith(f"<{PROCESS_TAG}>" if pooled else f"[{PROCESS_TAG}]")


def test_direct_url_from_its_variable_wins_and_is_named(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATABASE_URL", "postgresql://pgbouncer:6432/db")
    clean_env.setenv("CONVEYOR__DATABASE__DIRECT_URL", "postgresql://prefixed:5432/db")
    assert load_settings().settings.database.direct_url == "postgresql://prefixed:5432/db"
    clean_env.setenv("DATABASE_DIRECT_URL", "postgresql://primary:5432/db")
    loaded = load_settings()
    assert loaded.settings.database.direct_url == "postgresql://primary:5432/db"
    assert loaded.sources["database.direct_url"] == "env DATABASE_DIRECT_URL"
    assert loaded.sources["database.url"] == "env DATABASE_URL"

    clean_env.setenv("DATABASE_DIRECT_URL", "mysql://primary/db")
    with pytest.raises(ConveyorError, match=r"DATABASE_DIRECT_URL: 'mysql://primary/db' is not a PostgreSQL URL"):
        load_settings()


def test_a_direct_url_without_a_url_is_refused(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATABASE_DIRECT_URL", "postgresql://primary:5432/db")
    with pytest.raises(ConveyorError, match=r"database\.direct_url is set but database\.url is not"):
        load_settings()


def test_a_transaction_pooler_without_a_direct_url_is_refused(clean_env: pytest.MonkeyPatch) -> None:
    """The liveness locks and LISTEN would go through the pooler, which cannot carry them."""
    clean_env.setenv("DATABASE_URL", "postgresql://pgbouncer:6432/db")
    clean_env.setenv("CONVEYOR__DATABASE__POOLER", "transaction")
    with pytest.raises(ConveyorError, match=r"database\.pooler 'transaction' needs database\.direct_url"):
        load_settings()
    clean_env.setenv("DATABASE_DIRECT_URL", "postgresql://primary:5432/db")
    assert load_settings().settings.database.pooler == "transaction"


def test_a_pooler_refusing_the_startup_options_gets_the_fix() -> None:
    refused = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 6432 failed: '
        "FATAL:  unsupported startup parameter: options"
    )
    assert "set database.pooler: transaction and database.direct_url" in pooler_hint(refused)
    assert pooler_hint(psycopg.OperationalError("FATAL:  password authentication failed")) == ""


def test_config_show_computes_and_masks_the_direct_url() -> None:
    settings = Settings.model_validate({"database": {"url": "postgresql://u:secret@pgbouncer:6432/db"}})
    shown = effective(settings, {})
    assert shown["database.direct_url"] == ("postgresql://u:***@pgbouncer:6432/db", "computed")
    assert shown["database.prepared_statements"] == (True, "computed")
    settings = Settings.model_validate(
        {
            "database": {
                "url": "postgresql://pgbouncer:6432/db",
                "direct_url": "postgresql://u:pw@pg:5432/db",
                "pooler": "transaction",
            }
        }
    )
    shown = effective(settings, {})
    assert shown["database.direct_url"] == ("postgresql://u:***@pg:5432/db", "default")
    assert shown["database.prepared_statements"] == (False, "computed")
