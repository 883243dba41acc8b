"""The schema snapshot: ``sql/schema.sql`` is what the migrations produce, in one file.

Migrations are the history; the snapshot is the answer to "what does the schema look
like now" without replaying 0001..NNNN in one's head, and a reviewer sees a migration's
effect as a diff of it. A test migrates an empty database and compares its dump with the
file, so the two cannot drift. Regenerate after adding a migration:

    python -m conveyor.store.snapshot postgresql://postgres@127.0.0.1:5432/postgres

(it migrates a scratch database on that server, dumps it and rewrites the file). pg_dump
is PostgreSQL's own tool for exactly this; only its run-specific noise is removed here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from conveyor.store.migrate import migrate

SNAPSHOT = Path(__file__).parent / "sql" / "schema.sql"
HEADER = (
    "-- The schema the migrations produce (conveyor.store.snapshot; checked by a test).\n"
    "-- Do not edit: add a migration, then regenerate this file.\n"
)
# Lines that vary by pg_dump version or run, not by schema.
_NOISE = re.compile(r"^(--.*|SET .*|SELECT pg_catalog\.set_config.*|\\restrict .*|\\unrestrict .*)$")


def pg_dump_path() -> str | None:
    return shutil.which("pg_dump")


def dump_schema(url: str, schema: str) -> str:
    """The normalized ``pg_dump --schema-only`` of ``schema`` (no owners or privileges)."""
    tool = pg_dump_path()
    if tool is None:
        raise FileNotFoundError("pg_dump is not installed")
    out = subprocess.run(
        [tool, "--schema-only", "--no-owner", "--no-privileges", "--schema", schema, "--dbname", url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = [line.rstrip() for line in out.splitlines() if not _NOISE.match(line)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return HEADER + "\n" + text + "\n"


def regenerate(server_url: str, schema: str = "conveyor") -> str:
    name = f"conveyor_snapshot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
        # The migrations alone: what the service adds at start (the core pack's rows) is
        # data, which a schema-only dump leaves out.
        migrate(url, schema)
        text = dump_schema(url, schema)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    SNAPSHOT.write_text(text)
    return text


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m conveyor.store.snapshot SERVER_URL")
    regenerate(sys.argv[1])
    print(f"wrote {SNAPSHOT}")
