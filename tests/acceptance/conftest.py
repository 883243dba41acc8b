"""Fixtures shared by the acceptance tests. Each module defines ``env``: the environment
of the ``conveyor`` processes it starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Procs
from conveyor.store.db import connect_sync


@pytest.fixture
def procs(tmp_path: Path, env: dict[str, str]) -> Iterator[Procs]:
    """The test's processes: SIGKILLed at teardown (a stopped one too), logs printed."""
    group = Procs(tmp_path / "logs", env)
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def db(db_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with connect_sync(db_url, "conveyor", application_name="test", autocommit=True) as conn:
        yield conn
