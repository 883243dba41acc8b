"""The migrations produce exactly the committed schema snapshot (sql/schema.sql)."""

from __future__ import annotations

import difflib
import os

import pytest

from conveyor.service.app import prepare_database
from conveyor.store.snapshot import SNAPSHOT, dump_schema, pg_dump_path

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def test_the_migrations_produce_the_snapshot(empty_db_url: str) -> None:
    if pg_dump_path() is None:
        if IN_CI:
            pytest.fail("pg_dump is not installed (CI=true)")
        pytest.skip("pg_dump is not installed")
    prepare_database(empty_db_url, "conveyor")
    dumped = dump_schema(empty_db_url, "conveyor")
    committed = SNAPSHOT.read_text()
    if dumped != committed:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True), dumped.splitlines(keepends=True), "schema.sql", "migrated"
            )
        )
        pytest.fail(
            "the migrations and src/conveyor/store/sql/schema.sql differ; regenerate it with "
            "`python -m conveyor.store.snapshot SERVER_URL` (after adding a migration, never by hand):\n" + diff[:20000]
        )
