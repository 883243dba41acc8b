"""Test databases: each test gets its own database cloned from a migrated template.

PostgreSQL is found at TEST_DATABASE_URL, else on 127.0.0.1:5432, else the embedded
server is started, so the suite runs on a machine with no database installed. A
missing service skips locally but fails under CI=true.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conveyor.service.app import prepare_database

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SCHEMA = "conveyor"


# -- running in parallel (pytest-xdist, ``-n auto`` in pyproject.toml) ------------------


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Twice the cores, at most 6: most of a test's time is spent waiting on the processes
    and servers it drives, not on a core (PYTEST_XDIST_AUTO_NUM_WORKERS overrides)."""
    explicit = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if explicit.isdigit():
        return int(explicit)
    return max(2, min(6, 2 * (os.cpu_count() or 1)))


# The longest tests first (see pyproject.toml): the chaos runs, then the model-based and
# schema-fuzzing modules (single tests of a minute or more: started late, one alone made the
# run's tail), then the real-process tests, then the rest of the integration tests.
_SLOW_MODULES = frozenset({"test_model.py", "test_model_workflows.py", "test_api_schema.py", "test_api_events.py"})


def _rank(item: pytest.Item) -> int:
    parts = item.path.parts
    if "chaos" in parts:
        return 0
    if item.path.name in _SLOW_MODULES:
        return 1
    if "acceptance" in parts:
        return 2
    return 3 if "integration" in parts else 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: within a folder, the collection order


def _with_database(url: str, database: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=database)


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing service fails the run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A URL (to its maintenance database) of a PostgreSQL server tests may create databases on."""
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        if not _reachable(explicit):
            _unavailable(f"TEST_DATABASE_URL {explicit} is not reachable")
        yield explicit
        return
    local = "postgresql://postgres@127.0.0.1:5432/postgres"
    if _reachable(local):
        yield local
        return
    from conveyor.config import Settings
    from conveyor.service.embedded import running_server

    settings = Settings()
    settings.embedded.data_dir = Path(tempfile.mkdtemp(prefix="conveyor-test-pg-")) / "pgdata"
    try:
        with running_server(settings) as url:
            yield url
    except Exception as exc:  # no server at all: skip, or fail in CI
        _unavailable(f"no PostgreSQL: nothing at 127.0.0.1:5432 and the embedded one failed: {exc}")


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    name = f"conveyor_tpl_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    prepare_database(_with_database(pg_server_url, name), SCHEMA)
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test alone."""
    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    yield _with_database(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def empty_db_url(pg_server_url: str) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"conveyor_e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _with_database(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[dict[str, object]]]:
    """An autocommit connection to the test database with the schema on the search path."""
    from conveyor.store.db import connect_sync

    with connect_sync(db_url, SCHEMA, autocommit=True) as c:
        yield c


# -- RabbitMQ ---------------------------------------------------------------------------
# One broker for the run; each test gets its own name prefix (so its own exchanges, queues
# and dead-letter exchange) and has them deleted afterwards.


def _amqp_reachable(url: str) -> str | None:
    import asyncio

    import aio_pika

    async def probe() -> None:
        connection = await aio_pika.connect(url, timeout=5)
        await connection.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # any failure means: no usable broker
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The broker at TEST_RABBITMQ_URL, else guest@127.0.0.1:5672; skipped when absent
    (failed under CI=true)."""
    url = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    problem = _amqp_reachable(url)
    if problem:
        _unavailable(f"no RabbitMQ at {url}: {problem}")
    return url


def delete_broker_objects(url: str, prefix: str, worker_ids: range = range(1, 33)) -> None:
    """Delete what a test with this prefix may have declared (quorum queues outlive
    connections)."""
    import asyncio

    import aio_pika

    from conveyor.transport.messages import Names

    names = Names(prefix, f"{prefix}.dlx")

    async def clean() -> None:
        connection = await aio_pika.connect(url, timeout=5)
        async with connection:
            channel = await connection.channel()
            for queue in [names.executor_queue, names.dlq, *(names.worker_queue(w) for w in worker_ids)]:
                await channel.queue_delete(queue)
            for exchange in (names.executions, names.events, names.dlx):
                await channel.exchange_delete(exchange)

    asyncio.run(clean())


@pytest.fixture
def mq_prefix(rabbitmq_url: str) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    delete_broker_objects(rabbitmq_url, prefix)


@pytest.fixture(params=["postgres", "rabbitmq"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Run a test on both transports."""
    return str(request.param)


@pytest.fixture
def transport_env(transport_kind: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment for conveyor processes on the parametrized transport."""
    if transport_kind == "postgres":
        return {"CONVEYOR__TRANSPORT": "postgres"}
    url = request.getfixturevalue("rabbitmq_url")
    prefix = request.getfixturevalue("mq_prefix")
    return {
        "CONVEYOR__TRANSPORT": "rabbitmq",
        "CONVEYOR__MESSAGE_QUEUE__URL": url,
        "CONVEYOR__MESSAGE_QUEUE__PREFIX": prefix,
    }
