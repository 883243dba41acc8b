"""A PgBouncer of a test's own, in transaction pooling mode, in front of the shared
PostgreSQL (127.0.0.1:5432), which it only connects to.

Debian's pgbouncer package, not its service: each test runs its own ``pgbouncer`` process
with its own ini and userlist in a temporary directory, on one of this suite's ports
(6432-6439: two tests at once on the xdist workers take two of them). PgBouncer refuses
to run as root, so under root it runs as ``postgres`` (``runuser``), and its directory is
handed to that user. Its admin console (database ``pgbouncer``) answers only the simple
query protocol: read with psycopg's ClientCursor.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from psycopg import ClientCursor
from psycopg.rows import dict_row

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PORTS = range(6432, 6440)
BACKEND = ("127.0.0.1", 5432)

_INI = """\
[databases]
; Any database name: the same database on the backend (the per-test clones).
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {home}/userlist.txt
admin_users = postgres
pool_mode = transaction
; A small pool: Conveyor's client connections really share server connections.
default_pool_size = {pool}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = {pool}
; No ignore_startup_parameters: a client that sends `options` is refused, not silently
; given the wrong search_path.
idle_transaction_timeout = 60
log_connections = 0
log_disconnections = 0
"""


def unavailable(reason: str) -> NoReturn:
    """Skip locally; fail under CI=true (CI installs pgbouncer: .ci/run)."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing tool fails the run)")
    pytest.skip(reason)


def problem() -> str | None:
    """Why no PgBouncer can run here (None: it can)."""
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists():
        return "pgbouncer is not installed (Debian package pgbouncer)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "runuser is missing (pgbouncer refuses to run as root)"
    return None


@dataclass
class Bouncer:
    port: int
    pool_size: int
    home: Path
    popen: subprocess.Popen[bytes]

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A SHOW command of the admin console, as rows."""
        with psycopg.connect(
            self.url("pgbouncer"), autocommit=True, cursor_factory=ClientCursor, row_factory=dict_row
        ) as conn:
            return list(conn.execute(command).fetchall())  # type: ignore[arg-type]

    def command(self, command: str) -> None:
        """An admin command that returns no rows (RECONNECT, PAUSE, ...)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, cursor_factory=ClientCursor) as conn:
            conn.execute(command)  # type: ignore[arg-type]

    def log(self) -> str:
        return (self.home / "pgbouncer.log").read_text(errors="replace")


def _binary() -> str:
    return shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _start(port: int, pool_size: int, home: Path) -> subprocess.Popen[bytes]:
    ini = home / "pgbouncer.ini"
    ini.write_text(_INI.format(host=BACKEND[0], port=BACKEND[1], listen=port, home=home, pool=pool_size))
    (home / "userlist.txt").write_text('"postgres" ""\n')
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    with open(home / "pgbouncer.log", "ab") as log:
        return subprocess.Popen(
            [*prefix, _binary(), str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def _stop(popen: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(5)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def pgbouncer(pool_size: int = 3, start_timeout: float = 15.0) -> Iterator[Bouncer]:
    """Start PgBouncer on the first free port of PORTS; stop it and remove its directory
    afterwards. RuntimeError (with its log) if none comes up."""
    home = Path(tempfile.mkdtemp(prefix="conveyor-pgbouncer-"))
    home.chmod(0o755)
    bouncer: Bouncer | None = None
    with contextlib.ExitStack() as held:
        try:
            for port in PORTS:
                if not _claim(port, held):
                    continue
                bouncer = _up(port, pool_size, home, start_timeout)
                if bouncer is not None:
                    break
            if bouncer is None:
                raise RuntimeError(f"no free port for pgbouncer in {PORTS}")
            yield bouncer
        finally:
            if bouncer is not None:
                _stop(bouncer.popen)
            shutil.rmtree(home, ignore_errors=True)


def _claim(port: int, held: contextlib.ExitStack) -> bool:
    """Take the port for this test (a lock file held until the end: the xdist workers
    start their tests at the same moment, and one must not find another's pgbouncer)."""
    path = Path(tempfile.gettempdir()) / f"conveyor-pgbouncer-{port}.lock"
    lock = held.enter_context(path.open("w"))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _up(port: int, pool_size: int, home: Path, start_timeout: float) -> Bouncer | None:
    """PgBouncer on ``port``, once its console answers; None if the port is taken by
    something else."""
    with socket.socket() as probe:  # taken by something else (a pgbouncer service?): not ours to talk to
        # SO_REUSEADDR, as pgbouncer itself binds: a port whose last connections linger in
        # TIME_WAIT is free; one something listens on is not (Linux refuses that bind).
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return None
    popen = _start(port, pool_size, home)
    candidate = Bouncer(port, pool_size, home, popen)
    deadline = time.monotonic() + start_timeout
    while popen.poll() is None and time.monotonic() < deadline:
        try:
            candidate.admin("SHOW VERSION")
            return candidate
        except psycopg.OperationalError:
            time.sleep(0.05)
    _stop(popen)
    if "Address already in use" not in candidate.log():
        raise RuntimeError(f"pgbouncer did not start on port {port}:\n{candidate.log()}")
    return None
