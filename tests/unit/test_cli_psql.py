"""``conveyor psql`` without any psql to run: one line that says what to install."""

from __future__ import annotations

import pytest

from conveyor.cli import database
from conveyor.domain.errors import ConveyorError
from conveyor.service import embedded


def test_psql_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database.shutil, "which", lambda name: None)
    monkeypatch.setattr(embedded, "bundled_psql", lambda: None)
    with pytest.raises(ConveyorError, match=r"^psql is not installed .*postgresql-client.*conveyor db url"):
        database._psql_binary()


def test_the_embedded_servers_psql_is_found() -> None:
    found = embedded.bundled_psql()
    assert found is not None
    assert found.name == "psql"
