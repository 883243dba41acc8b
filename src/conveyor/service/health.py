"""``GET /healthz`` and ``GET /readyz`` for Kubernetes probes, on ``health.port``.

Hand-written on asyncio streams rather than a web framework: two fixed routes, and
answering from the service's own event loop is the point -- a blocked loop shows up
as a probe that times out, and the measured loop lag fails readiness.

- /healthz: 200 while the process's loop answers.
- /metrics: Prometheus metrics of this process.
- /readyz: 200 when the database answers within a second, the loop lags less than
  ``health.max_loop_lag`` and every service in the process says it is ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import prometheus_client
import psycopg
import structlog

from conveyor.config import HealthSettings
from conveyor.domain.errors import ConveyorError
from conveyor.store.db import Pool

log = structlog.get_logger(__name__)


class HealthServer:
    def __init__(self, cfg: HealthSettings, pool: Pool, ready: Callable[[], dict[str, bool]]) -> None:
        self._cfg = cfg
        self._pool = pool
        self._ready = ready
        self.loop_lag = 0.0

    async def run(self) -> None:
        assert self._cfg.port is not None
        try:
            server = await asyncio.start_server(self._handle, self._cfg.host, self._cfg.port)
        except OSError as exc:  # taken, or not an address of this host: say which setting to change
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ConveyorError(
                f"the health endpoint cannot listen on {self._cfg.host}:{self._cfg.port} ({reason}): "
                "set health.port (CONVEYOR__HEALTH__PORT) to a free port, or health.host to an address of this host"
            ) from None
        log.info("health endpoint listening", host=self._cfg.host, port=self._cfg.port)
        async with server:
            await self._measure_lag()

    async def _measure_lag(self) -> None:
        period = 0.25
        while True:
            started = time.monotonic()
            await asyncio.sleep(period)
            self.loop_lag = max(0.0, time.monotonic() - started - period)

    async def _database_ok(self) -> bool:
        try:
            async with asyncio.timeout(1.0), self._pool.connection() as conn:
                await conn.execute("SELECT 1")
            return True
        except (psycopg.Error, TimeoutError):
            return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                while (await reader.readline()).strip():
                    pass  # headers: not needed
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else ""
            body: dict[str, Any]
            if path == "/metrics":
                text = prometheus_client.generate_latest()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: "
                    + prometheus_client.CONTENT_TYPE_LATEST.encode()
                    + f"\r\nContent-Length: {len(text)}\r\nConnection: close\r\n\r\n".encode()
                    + text
                )
                await writer.drain()
                return
            if path == "/healthz":
                status, body = 200, {"status": "ok"}
            elif path == "/readyz":
                checks = {"database": await self._database_ok(), "loop": self.loop_lag < self._cfg.max_loop_lag}
                checks.update(self._ready())
                status = 200 if all(checks.values()) else 503
                body = {
                    "status": "ready" if status == 200 else "not ready",
                    "checks": checks,
                    "loop_lag_seconds": round(self.loop_lag, 4),
                }
            else:
                status, body = 404, {"error": f"no such endpoint {path!r}; try /healthz, /readyz or /metrics"}
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass  # a broken probe connection is the prober's problem
        finally:
            writer.close()
