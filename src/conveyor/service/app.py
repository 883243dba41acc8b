"""Running services in one process: migrations, the transport, executor and/or
worker under one task group, with two-phase signal handling (the first SIGTERM or
SIGINT drains, a second one exits fast)."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import structlog

from conveyor.actions.core import core
from conveyor.actions.registry import ActionDefinition, default_registry
from conveyor.config import Settings
from conveyor.domain.errors import ConveyorError
from conveyor.executor.service import ExecutorService
from conveyor.service.health import HealthServer
from conveyor.store.db import (
    IDLE_IN_TRANSACTION,
    Conn,
    Pool,
    check_pool_url,
    check_pooled_sessions,
    connect_sync,
    make_pool,
    pooler_hint,
    refused_for_good,
)
from conveyor.store.migrate import Migration, migrate
from conveyor.store.queries import Q
from conveyor.transport import make_transport
from conveyor.verbs import actions as action_verbs
from conveyor.verbs.drive import run
from conveyor.worker.service import WorkerService

log = structlog.get_logger(__name__)

# A service started while the database is down retries after 0.5 s, then doubling up to 10 s.
_START_RETRY, _START_RETRY_MAX = 0.5, 10.0


def load_actions(imports: Sequence[str]) -> list[ActionDefinition]:
    """The core pack plus every action the imported modules register. Modules are found
    in the current directory too, as ``python -m`` would: the ``conveyor`` script's own
    sys.path starts with its bin directory instead (``--import myactions`` next to
    ``myactions.py`` must work either way)."""
    if imports:
        here = os.getcwd()
        if not any(os.path.abspath(p or ".") == here for p in sys.path):
            sys.path.insert(0, here)
    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConveyorError(f"cannot import action module {module!r}: {exc}") from exc
    actions = {a.ref: a for a in core}
    for definition in default_registry:
        actions[definition.ref] = definition
    return list(actions.values())


def upsert_actions(conn: Conn, definitions: Iterable[ActionDefinition]) -> None:
    run(conn, action_verbs.offer(definitions))


def prepare_database(url: str, schema: str) -> list[Migration]:
    """Migrate, and record the core pack so its actions can be requested (and fail
    with "no workers available" rather than "unknown action") before any worker ran."""
    applied = migrate(url, schema)
    with connect_sync(url, schema, application_name="conveyor-migrate") as conn, conn.transaction():
        upsert_actions(conn, core)
    return applied


@contextmanager
def _signals(stop: asyncio.Event, fast: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if not stop.is_set():
            log.info("shutting down gracefully; send the signal again to exit fast", signal=signal.Signals(signum).name)
            stop.set()
        else:
            log.warning("fast shutdown", signal=signal.Signals(signum).name)
            fast.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def serve(
    settings: Settings,
    url: str,
    *,
    run_executor: bool,
    run_worker: bool,
    run_api: bool = False,
    bootstrap_token: bool = False,
    imports: Sequence[str] = (),
    on_ready: Callable[[Started], None] | None = None,
) -> None:
    """Run the asked services in this process until SIGTERM/SIGINT (graceful; a second
    signal: fast). ``bootstrap_token``: with the API, create and report an admin token
    if none exists yet (``conveyor up`` on a fresh database)."""
    schema = settings.database.schema_name
    # ``url`` serves the pool, which may go through a transaction pooler; everything that
    # needs one server session for its whole life (the migration lock, LISTEN, the worker's
    # liveness lock, the executor's duty locks) goes to the direct URL (docs/deployment.md,
    # "Connection poolers").
    direct = settings.database.direct_url or url
    pooled = settings.database.pooler == "transaction"
    actions = load_actions([*settings.worker.imports, *imports]) if run_worker else []
    applied = await _prepare_when_reachable(direct, schema)
    if applied:
        log.info("schema migrated", schema=schema, versions=[m.version for m in applied])

    api_socket = None
    if run_api:
        from conveyor.api.server import bind  # the web stack only when serving it

        api_socket = bind(settings.api)
    stop, fast = asyncio.Event(), asyncio.Event()
    roles = "+".join(r for r, on in (("executor", run_executor), ("worker", run_worker), ("api", run_api)) if on)
    if not pooled and url != direct:
        await check_pool_url(url, schema, f"conveyor-{roles}")  # a pooler the settings do not mention
    # A worker's transactions hold locks on its executions: a worker frozen inside one must
    # not keep them past the moment the executors recover that work (store/db.py).
    # (`conveyor up` keeps the executor's bound: its executor's rounds share the pool.)
    # An executor's passes hold schedules, workflows, events and the sweep: one frozen
    # inside a pass must not hold them from the other replicas past executor_liveness.hold_timeout
    # (a schedule's slot would then be late enough to be missed).
    worker_only = run_worker and not run_executor
    idle = min(IDLE_IN_TRANSACTION, settings.worker.self_fence_after) if worker_only else IDLE_IN_TRANSACTION
    if run_executor:
        idle = min(idle, settings.executor_liveness.hold_timeout)
    pool = make_pool(
        url,
        schema,
        f"conveyor-{roles}",
        settings.database.pool_size,
        pooled=pooled,
        prepare_threshold=settings.database.prepare_threshold,
        idle_timeout=idle,
        reconnect_interval=settings.database.reconnect_interval,
        timeout=settings.database.pool_timeout,
    )
    await pool.open(wait=True, timeout=30)
    try:
        if pooled:
            await check_pooled_sessions(pool, schema)
        transport = make_transport(
            settings, direct, pool, relay=run_executor, application_name=f"conveyor-{roles}-listen"
        )
        if run_executor or run_worker:
            async with pool.connection() as conn:
                await transport.declare_route(conn)
        executor = ExecutorService(settings, direct, pool, transport) if run_executor else None
        worker = WorkerService(settings, direct, pool, transport, actions) if run_worker else None
        if worker is not None:
            await worker.register()
        with _signals(stop, fast):
            async with asyncio.TaskGroup() as tg:
                ready = asyncio.Event()
                listener = tg.create_task(transport.run(ready), name="transport")
                health = None
                if settings.health.port is not None:

                    def readiness() -> dict[str, bool]:
                        checks = {"transport": transport.connected}
                        if worker is not None:
                            checks["worker"] = worker.ready
                        if executor is not None:
                            checks["executor_duties"] = executor.ready
                        return checks

                    health = tg.create_task(HealthServer(settings.health, pool, readiness).run(), name="health")
                await ready.wait()
                services = []
                if executor is not None:
                    services.append(tg.create_task(executor.run(stop), name="executor"))
                if worker is not None:
                    services.append(tg.create_task(worker.run(stop, fast), name="worker"))
                started = Started(worker.name if worker else None)
                if api_socket is not None:
                    from conveyor.api.server import serve_api

                    api = serve_api(settings, pool, transport, stop, api_socket)
                    services.append(tg.create_task(api, name="api"))
                    port = api_socket.getsockname()[1]
                    started.api_url = f"http://{_display_host(settings.api.host)}:{port}"
                    if bootstrap_token:
                        started.admin_token = await _bootstrap_token(pool)
                if on_ready is not None:
                    on_ready(started)
                await asyncio.gather(*services)
                listener.cancel()
                if health is not None:
                    health.cancel()
    finally:
        await pool.close()
        if api_socket is not None:
            api_socket.close()


async def _prepare_when_reachable(url: str, schema: str) -> list[Migration]:
    """``prepare_database``, waiting for a server that is down, starting or full: services
    are often started beside the database (a reboot, a compose file, a pod), and one that
    exits would need a supervisor to try again. A server that answers and refuses
    (authentication, no such database) is an error at once: waiting changes nothing."""
    delay, attempt = _START_RETRY, 0
    while True:
        try:
            return await asyncio.to_thread(prepare_database, url, schema)
        except psycopg.OperationalError as exc:
            if refused_for_good(exc):
                raise ConveyorError(f"cannot reach the database: {str(exc).strip()}{pooler_hint(exc)}") from exc
            attempt += 1
            log.warning(
                "database unreachable at start; retrying", error=str(exc).strip(), attempt=attempt, retry_in=delay
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, _START_RETRY_MAX)


@dataclass(slots=True)
class Started:
    """What ``serve`` tells its caller once the services run."""

    worker_name: str | None
    api_url: str | None = None
    admin_token: str | None = None  # created now: shown once


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


async def _bootstrap_token(pool: Pool) -> str | None:
    """An admin token for the first start (none exists yet); None afterwards."""
    from conveyor.api.auth import Role, create_token

    async with pool.connection() as conn, conn.transaction():
        await conn.execute("LOCK TABLE api_token IN SHARE ROW EXCLUSIVE MODE")  # two `up`s: one token
        row = await (await conn.execute(Q["count_admin_tokens"])).fetchone()
        if row and row["n"]:
            return None
        token, _ = await create_token(conn, "admin (conveyor up)", Role.admin)
    return token


def exit_if_actions_linger() -> None:
    """A sync Python action cannot be interrupted; its execution has been released (and
    may run elsewhere), so its thread must not keep running here: end the process now
    instead of letting the interpreter wait for it at exit. Called last, after
    everything else (the embedded database included) is stopped."""
    lingering = []
    for thread in threading.enumerate():
        if thread.name.startswith("conveyor-action"):
            thread.join(timeout=0.5)  # idle pool threads leave promptly; busy ones do not
            if thread.is_alive():
                lingering.append(thread)
    if lingering:
        log.warning("exiting with action threads still running; they stop with the process", threads=len(lingering))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
