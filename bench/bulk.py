"""Bulk request benchmark (not a test): the SDK's request_executions of N executions in
one call, in one transaction, against a fresh database on an already-running PostgreSQL.

    python bench/bulk.py [--url postgresql://postgres@127.0.0.1/postgres] [--n 100000] [--runs 3]

Each run, in this order and on the same database:
  - reference A: a plain COPY of N rows (text, jsonb) into an unlogged scratch table;
  - reference B: INSERT INTO execution ... SELECT FROM generate_series(1, N) -- the same
    table, indexes and triggers, no parameters to send or check (what the table costs);
  - request_executions(conn, [(ref, params)] * N) with distinct parameters per row, an
    action whose schema has required, typed, bounded and enum properties (every row is
    checked by the SDK's JSON Schema and by the database's subset), then COMMIT.
Prints rows/s of each, the median over the runs, and the settings.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from conveyor.sdk import request_executions
from conveyor.service.app import prepare_database

SCHEMA = "conveyor"
ACTION = "bench.bulk"
PARAMETERS_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "integer", "minimum": 0},
        "region": {"type": "string", "enum": ["eu", "us", "ap"]},
        "note": {"type": "string", "maxLength": 40},
    },
    "required": ["order"],
    "additionalProperties": False,
}


def fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    prepare_database(url, SCHEMA)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.action (ref, pack, name, runner_type, runtime, parameters_schema)"
                " VALUES (%s, 'bench', 'bulk', 'python', 'python', %s)"
            ).format(sql.Identifier(SCHEMA)),
            (ACTION, Jsonb(PARAMETERS_SCHEMA)),
        )
    return url


def rows(n: int) -> list[tuple[str, dict[str, Any]]]:
    regions = ("eu", "us", "ap")
    return [(ACTION, {"order": i, "region": regions[i % 3], "note": f"order {i}"}) for i in range(n)]


def timed(conn: psycopg.Connection[Any], work: Any) -> float:
    conn.execute(sql.SQL("TRUNCATE {}.execution CASCADE").format(sql.Identifier(SCHEMA)))
    conn.execute("CHECKPOINT")  # each measure starts without the previous one's dirty pages
    t0 = time.perf_counter()
    with conn.transaction():
        work()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    url = fresh_database(args.url, "conveyor_bench_bulk")
    batch = rows(args.n)
    figures: dict[str, list[float]] = {"copy_unlogged": [], "insert_generate_series": [], "request_executions": []}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE UNLOGGED TABLE scratch (action_ref text, parameters jsonb)")

        def copy_reference() -> None:
            conn.execute("TRUNCATE scratch")
            with conn.cursor().copy("COPY scratch FROM STDIN") as copy:
                for ref, params in batch:
                    copy.write_row((ref, Jsonb(params)))

        def insert_reference() -> None:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.execution (action_ref, parameters) SELECT %s, jsonb_build_object("
                    "'order', g, 'region', (ARRAY['eu', 'us', 'ap'])[g %% 3 + 1], 'note', 'order ' || g)"
                    " FROM generate_series(1, %s) g"
                ).format(sql.Identifier(SCHEMA)),
                (ACTION, args.n),
            )

        def bulk() -> None:
            ids = request_executions(conn, batch)
            assert len(ids) == args.n

        for run in range(args.runs):
            for name, work in (
                ("copy_unlogged", copy_reference),
                ("insert_generate_series", insert_reference),
                ("request_executions", bulk),
            ):
                elapsed = timed(conn, work)
                figures[name].append(args.n / elapsed)
                print(f"run {run + 1}: {name:24} {elapsed:7.3f} s  {args.n / elapsed:9.0f} rows/s", flush=True)
        settings = {
            k: conn.execute(f"SHOW {k}").fetchone()[0]  # type: ignore[index]
            for k in ("server_version", "shared_buffers", "synchronous_commit", "wal_level", "max_wal_size")
        }
    print()
    print(f"median rows/s over {args.runs} runs, {args.n} rows per call:")
    for name, values in figures.items():
        print(f"  {name:24} {statistics.median(values):9.0f}")
    ratio = statistics.median(figures["request_executions"]) / statistics.median(figures["insert_generate_series"])
    print(f"  request_executions / insert_generate_series: {ratio:.2f}")
    print()
    print(f"settings: n={args.n} runs={args.runs} python={platform.python_version()} cpus={os.cpu_count()}")
    print(f"  load average at the end: {os.getloadavg()}")
    print("  postgres: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"  schema of {ACTION}: {PARAMETERS_SCHEMA}")


if __name__ == "__main__":
    main()
