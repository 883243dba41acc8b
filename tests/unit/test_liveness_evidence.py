"""How a worker tells a server going down from its own session alone being dropped (the
decision that keeps its work running through a restart, or stops it within lock_grace),
and which connection failures a service waits out at start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest

from conveyor.config import WorkerSettings
from conveyor.store.db import refused_for_good, server_restarting
from conveyor.worker.liveness import Liveness

OperationalError = psycopg.OperationalError
AT = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@dataclass
class Said:
    """What the server sent as it ended the session (the fields of a Diagnostic we read)."""

    sqlstate: str | None
    severity_nonlocalized: str | None
    message_primary: str | None = None


IMMEDIATE = Said("57P01", "WARNING", "terminating connection due to immediate shutdown command")
CRASH = Said("57P02", "WARNING", "terminating connection because of crash of another server process")
TERMINATED = Said("57P01", "FATAL", "terminating connection due to administrator command")  # or a fast shutdown
CLOSED = OperationalError("consuming input failed: server closed the connection unexpectedly")
CONNECTION_REFUSED = OperationalError(AT + "Connection refused\n\tIs the server running on that host?")
STARTING = OperationalError(AT + "FATAL:  the database system is starting up")
FULL = OperationalError(AT + "FATAL:  sorry, too many clients already")
NO_DATABASE = OperationalError(AT + 'FATAL:  database "nope" does not exist')
# A multi-host URL (target_session_attrs=read-write) during a failover: the old primary
# gone, the standby not promoted yet -- readable, or not at all (hot_standby=off). Both
# take connections once it is promoted.
ONLY_A_STANDBY = OperationalError(
    AT + "session is read-only\nMultiple connection attempts failed. All failures were:\n"
    "- host: 'a': " + AT + "Connection refused\n- host: 'b': " + AT + "session is read-only"
)
STANDBY_NOT_HOT = OperationalError(
    AT + "FATAL:  the database system is not accepting connections\nDETAIL:  Hot standby mode is disabled."
)
BAD_PASSWORD = OperationalError(AT + 'FATAL:  password authentication failed for user "conveyor"')


def liveness() -> Liveness:
    async def nothing(*_: Any) -> None:
        return None

    registration = {"name": "w", "runtimes": [], "actions": [], "capabilities": None, "capacity": 1,
                    "host": "h", "pid": 1, "version": "t"}  # fmt: skip
    return Liveness("postgresql://unused", "conveyor", WorkerSettings(), registration, nothing, nothing)


@pytest.mark.parametrize(
    ("last_words", "reconnect", "going_down"),
    [
        # The server said it is going down: whatever the reconnection meets.
        (IMMEDIATE, CONNECTION_REFUSED, True),
        (IMMEDIATE, TimeoutError(), True),
        (CRASH, CLOSED, True),
        # The server answered the reconnection that it is starting (or stopping).
        (None, STARTING, True),
        (TERMINATED, STARTING, True),
        # Ended by the server (fast shutdown or pg_terminate_backend), then no server at all:
        # a shutdown -- after pg_terminate_backend the server still answers.
        (TERMINATED, CONNECTION_REFUSED, True),
        (TERMINATED, CLOSED, True),
        # ... but a server that answers is up: its executors may act on the missing lock.
        (TERMINATED, FULL, False),
        (TERMINATED, BAD_PASSWORD, False),
        (TERMINATED, TimeoutError(), False),
        # Nothing said: the session vanished (a proxy, a cut path, a host gone); no server
        # reached within the grace may still be a live one for the executors.
        (None, CONNECTION_REFUSED, False),
        (None, CLOSED, False),
        (None, TimeoutError(), False),
        (None, FULL, False),
    ],
)
def test_server_going_down_only_on_the_servers_word(
    last_words: Said | None, reconnect: BaseException, going_down: bool
) -> None:
    live = liveness()
    if last_words is not None:
        live._note_ending(cast(psycopg.errors.Diagnostic, last_words))
    assert (live._server_going_down(reconnect) is not None) is going_down


def test_a_new_connection_forgets_what_the_server_said() -> None:
    """The evidence is reset by the next connection the server accepts (in _connect): a
    later drop is judged on its own."""
    live = liveness()
    live._note_ending(cast(psycopg.errors.Diagnostic, IMMEDIATE))
    assert live._server_going_down(CONNECTION_REFUSED) is not None
    live._going_down, live._ended_by_server = None, False  # what _connect does once connected
    assert live._server_going_down(CONNECTION_REFUSED) is None


@pytest.mark.parametrize(
    ("failure", "restarting", "for_good"),
    [
        (CONNECTION_REFUSED, False, False),
        (CLOSED, False, False),
        (STARTING, True, False),
        (OperationalError(AT + "FATAL:  the database system is shutting down"), True, False),
        (OperationalError(AT + "FATAL:  the database system is in recovery mode"), True, False),
        (FULL, False, False),
        (ONLY_A_STANDBY, False, False),
        (STANDBY_NOT_HOT, True, False),
        (NO_DATABASE, False, True),
        (BAD_PASSWORD, False, True),
        (OperationalError(AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.1"'), False, True),
        (ValueError("FATAL: not a database error"), False, False),
    ],
)
def test_connection_failures_at_start(failure: BaseException, restarting: bool, for_good: bool) -> None:
    assert server_restarting(failure) is restarting
    assert refused_for_good(failure) is for_good
