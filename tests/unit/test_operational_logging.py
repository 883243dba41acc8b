"""How a retried pass names the OperationalError that ended it: a transaction the server
rolled back (deadlock, serialization failure) is not an outage."""

from __future__ import annotations

import psycopg
import pytest
import structlog
from structlog.testing import capture_logs

from conveyor.store.db import log_operational


@pytest.mark.parametrize(
    ("exc", "sqlstate"),
    [
        (psycopg.errors.DeadlockDetected("deadlock detected\n"), "40P01"),
        (psycopg.errors.SerializationFailure("could not serialize access"), "40001"),
    ],
)
def test_a_rollback_is_retried_not_an_outage(exc: psycopg.OperationalError, sqlstate: str) -> None:
    with capture_logs() as events:
        log_operational(structlog.get_logger("test"), "workflow pass", exc)
    assert events == [
        {
            "event": "workflow pass rolled back by the database (deadlock or serialization failure); retrying",
            "log_level": "info",
            "sqlstate": sqlstate,
            "error": str(exc).strip(),
        }
    ]


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection failed: connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    ],
)
def test_anything_else_is_the_database_unreachable(exc: psycopg.OperationalError) -> None:
    with capture_logs() as events:
        log_operational(structlog.get_logger("test"), "recovery duty", exc, duty="_sweep")
    assert events == [
        {
            "event": "recovery duty failed; database unreachable",
            "log_level": "warning",
            "error": str(exc).strip(),
            "duty": "_sweep",
        }
    ]
