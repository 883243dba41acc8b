"""A private primary and streaming standby (Debian's PostgreSQL 15 binaries: the pgserver
wheel of pg.py has no pg_basebackup) for tests that fail PostgreSQL over. The shared server
on :5432 is never touched.

As root the servers run as the OS user ``postgres`` from a fresh directory under /tmp it
owns. Ports come from this suite's private range (5510-5519), the first free pair.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor.service.app import prepare_database
from support.polling import eventually

BIN = Path(os.environ.get("CONVEYOR_TEST_PG15_BIN", "/usr/lib/postgresql/15/bin"))
PORTS = range(5510, 5520)
STANDBY_NAME = "standby1"


def missing_tools() -> str | None:
    """Why a pair cannot be made here, or None."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup"):
        if not (BIN / tool).exists():
            return f"no {BIN / tool} (Debian's postgresql-15)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no OS user 'postgres' to run the servers as"
    return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the postmaster does
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _ports_lock() -> Iterator[None]:
    """Held from choosing a pair's ports until both servers listen on them: two tests
    (pytest-xdist) must not choose the same free ports."""
    with open("/tmp/conveyor-pg-pair-ports.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_ports(count: int) -> list[int]:
    found = [p for p in PORTS if _port_free(p)][:count]
    if len(found) < count:
        raise OSError(f"fewer than {count} free ports in {PORTS.start}-{PORTS.stop - 1}")
    return found


class Node:
    def __init__(self, pair: PgPair, name: str, port: int) -> None:
        self.pair, self.name, self.port = pair, name, port
        self.data = pair.base / name
        self.log = pair.base / f"{name}.log"

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def ctl(self, *args: str) -> None:
        self.pair.run("pg_ctl", "-D", str(self.data), *args)

    def start(self) -> None:
        self.ctl("-w", "-t", "60", "-l", str(self.log), "start")

    def stop(self, mode: str) -> None:
        self.ctl("-w", "-t", "60", "-m", mode, "stop")

    def promote(self) -> None:
        self.ctl("-w", "-t", "60", "promote")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def logs(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return f"=== {self.name} on :{self.port}\n{text[-8_000:]}"


class PgPair:
    """``primary`` streams to ``standby``; synchronously (``synchronous_standby_names``,
    ``synchronous_commit=on``: a commit returns once the standby has flushed it) or not."""

    def __init__(self, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.base = Path(tempfile.mkdtemp(prefix="conveyor-failover-", dir="/tmp"))
        self.user: str | None = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
            self.user = "postgres"
        self.base.chmod(0o700 if self.user is None else 0o755)
        self.primary = Node(self, "primary", 0)  # ports chosen by create()
        self.standby = Node(self, "standby", 0)

    def run(self, tool: str, *args: str) -> None:
        # Output to a file, not a pipe: the postmaster inherits pg_ctl's descriptors.
        with open(self.base / "tools.out", "ab") as out:
            subprocess.run([str(BIN / tool), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                           user=self.user, cwd=self.base, timeout=120, check=True)  # fmt: skip

    def _conf(self, node: Node, settings: dict[str, Any]) -> None:
        lines = "".join(f"{k} = '{v}'\n" for k, v in settings.items())
        with open(node.data / "postgresql.conf", "a") as f:
            f.write(lines)

    def create(self) -> None:
        """initdb the primary, start it, clone the standby with pg_basebackup, start it and
        wait until it streams (as the synchronous standby when synchronous)."""
        p, s = self.primary, self.standby
        self.run("initdb", "--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(p.data))
        common = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.base),
            "wal_level": "replica",
            "hot_standby": "on",
            "max_wal_senders": 5,
            "max_connections": 100,
            "synchronous_commit": "on",
            "synchronous_standby_names": STANDBY_NAME if self.synchronous else "",
            # Speed on a shared test machine; an immediate stop loses nothing the OS holds.
            "fsync": "off",
            "full_page_writes": "off",
        }
        with _ports_lock():
            p.port, s.port = _free_ports(2)
            self._conf(p, {**common, "port": p.port})
            p.start()
            self.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres", "-D", str(s.data),
                     "-X", "stream", "--checkpoint=fast")  # fmt: skip
            # The standby's configuration is the primary's copy. Promoted with no standby of
            # its own, it must not wait for one: every commit would hang (what a failover
            # manager, e.g. Patroni, reconfigures at promotion).
            self._conf(s, {"port": s.port, "synchronous_standby_names": "", "primary_conninfo":
                           f"host=127.0.0.1 port={p.port} user=postgres application_name={STANDBY_NAME}"})  # fmt: skip
            (s.data / "standby.signal").touch()
            if self.user is not None:
                shutil.chown(s.data / "standby.signal", self.user, self.user)
            s.start()
        wanted = "sync" if self.synchronous else "async"

        def streaming() -> bool:
            with psycopg.connect(p.url("postgres"), autocommit=True) as conn:
                row = conn.execute("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                                   (STANDBY_NAME,)).fetchone()  # fmt: skip
            return row is not None and row[0] == wanted

        eventually(streaming, timeout=30, interval=0.1, message=self.logs)

    def url(self, dbname: str, ports: tuple[int, int] | None = None) -> str:
        """Both servers (or what forwards to them, ``ports``), the writable one chosen at
        each connection."""
        a, b = ports or (self.primary.port, self.standby.port)
        return f"postgresql://postgres@127.0.0.1:{a},127.0.0.1:{b}/{dbname}?target_session_attrs=read-write&connect_timeout=2"

    def conninfo(self, dbname: str, ports: tuple[int, int] | None = None) -> str:
        """The same, as a key=value connection string."""
        a, b = ports or (self.primary.port, self.standby.port)
        return (f"host=127.0.0.1,127.0.0.1 port={a},{b} dbname={dbname} user=postgres "
                "target_session_attrs=read-write connect_timeout=2")  # fmt: skip

    def logs(self) -> str:
        return self.primary.logs() + "\n" + self.standby.logs()

    def destroy(self) -> None:
        for node in (self.standby, self.primary):
            if node.running():
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    node.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def migrated_pair(synchronous: bool, dbname: str, schema: str) -> Iterator[PgPair]:
    """A pair with ``dbname`` migrated on the primary (and so on the standby); destroyed
    afterwards. Skipped where it cannot be made, unless in CI."""
    problem = missing_tools()
    if problem:
        if IN_CI:
            pytest.fail(f"{problem} (CI=true: a missing tool fails the run)")
        pytest.skip(problem)
    servers = PgPair(synchronous)
    try:
        try:
            servers.create()
        except (subprocess.SubprocessError, OSError) as exc:
            message = f"cannot make a primary and standby: {exc}\n{servers.logs()}"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        with psycopg.connect(servers.primary.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {dbname}")
        prepare_database(servers.primary.url(dbname), schema)
        yield servers
    finally:
        servers.destroy()


@contextlib.contextmanager
def replication_cut(pair: PgPair) -> Iterator[None]:
    """The standby's WAL receiver frozen (SIGSTOP): what the primary commits meanwhile
    does not reach the standby's disk -- an asynchronous standby's lag, made certain. On
    leaving, it is killed (SIGKILL), not resumed: resumed, it would read what the primary
    sent into its socket meanwhile. The standby restarts (crash recovery, as a standby)
    without it; this waits until it accepts connections again."""
    with psycopg.connect(pair.standby.url("postgres"), autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
    assert row is not None, pair.logs()
    os.kill(row[0], signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(row[0], signal.SIGKILL)

    def back() -> bool:
        with psycopg.connect(pair.standby.url("postgres"), autocommit=True, connect_timeout=2) as conn:
            return bool(conn.execute("SELECT pg_is_in_recovery()").fetchone())

    eventually(back, timeout=30, interval=0.1, message=pair.logs)
