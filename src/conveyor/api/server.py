"""Serving the API inside a Conveyor process's event loop (uvicorn), so that ``conveyor
up`` runs it beside the executor and worker and our signal handling stays in charge."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import structlog
import uvicorn
from psycopg_pool import AsyncConnectionPool

from conveyor.api.app import create_app
from conveyor.config import ApiSettings, Settings
from conveyor.domain.errors import ConveyorError
from conveyor.transport.base import Transport

log = structlog.get_logger(__name__)


class _Server(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the process's own handlers decide when to stop (graceful, then fast)


def bind(cfg: ApiSettings) -> socket.socket:
    """The listening socket, bound before any service starts: a port in use is a clear
    error at start, not a failure after the worker has registered."""
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise ConveyorError(
            f"the API cannot listen on {cfg.host}:{cfg.port}: {exc.strerror} (set api.port or CONVEYOR__API__PORT)"
        ) from None
    sock.set_inheritable(True)
    return sock


async def serve_api(
    settings: Settings,
    pool: AsyncConnectionPool[Any],
    transport: Transport,
    stop: asyncio.Event,
    sock: socket.socket,
) -> None:
    cfg = settings.api
    config = uvicorn.Config(
        create_app(settings, pool, transport),
        host=cfg.host,
        port=cfg.port,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)

    async def stop_when_asked() -> None:
        await stop.wait()
        server.should_exit = True

    watcher = asyncio.create_task(stop_when_asked())
    try:
        host, port = sock.getsockname()[:2]
        log.info("API listening", url=f"http://{host}:{port}", docs=f"http://{host}:{port}/docs")
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
