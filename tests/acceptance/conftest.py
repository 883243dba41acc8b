"""Fixtures shared by the acceptance tests. Each module defines ``env``: the environment
of the ``conveyor`` processes it starts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acceptance.helpers import Procs
from acceptance.pg import PrivatePostgres
from conveyor.service.app import prepare_database
from conveyor.store.db import connect_sync

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL (acceptance/pg.py), migrated, for tests that stop, restart or
    crash the server; destroyed afterwards. Skipped where it cannot start, unless in CI."""
    server = PrivatePostgres()
    try:
        try:
            server.init()
            server.start()
        except (subprocess.SubprocessError, OSError) as exc:
            message = f"cannot start a private PostgreSQL: {exc}\n{server.logs()}"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        prepare_database(server.url, "conveyor")
        yield server
    finally:
        server.destroy()
