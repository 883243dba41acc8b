"""A verb the database rolled back past its retries (deadlock, serialization failure) is
one line that says so: the database is up, and running the command again is the cure
(it read "cannot reach the database: deadlock detected", then the server's DETAIL lines)."""

from __future__ import annotations

import psycopg
import pytest

from conveyor.cli.main import _user_facing

DETAIL = "\nDETAIL:  Process 1 waits for ShareLock on transaction 2; blocked by process 3.\nHINT:  See server log."


@pytest.mark.parametrize("error", [psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure])
def test_a_rolled_back_verb_is_one_line_not_an_outage(error: type[psycopg.OperationalError]) -> None:
    message = _user_facing(error("could not serialize" + DETAIL))
    assert message == f"the database rolled this back ({error.sqlstate}); nothing was done: run it again"


def test_an_outage_still_reads_as_one() -> None:
    message = _user_facing(psycopg.OperationalError("connection refused"))
    assert message is not None
    assert message.startswith("cannot reach the database: connection refused")
