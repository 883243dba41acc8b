"""Live output: what a running execution prints, sent to the database in chunks while it
runs (``execution_output``, migration 0029), so that readers see it as it comes and a worker
that dies leaves what it had sent.

One writer per worker flushes every run's new bytes in one statement every
``worker.output_interval`` seconds, sooner when a lot is waiting, and a run's last bytes
when it ends, before its result is written (the append is fenced on a live status, so
after the result it would be refused). A run that prints nothing costs nothing: no chunk,
no statement. The bytes are the ones the result keeps (each stream capped at
``worker.output_limit``); chunks end on a UTF-8 character boundary while more may follow,
so a reader can decode each chunk on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import structlog

from conveyor.store.db import SESSION_ENDED, Pool
from conveyor.store.queries import Q

log = structlog.get_logger(__name__)

STREAMS = ("stdout", "stderr", "log")
_SOON = 64 * 1024  # bytes waiting that make the writer flush before its interval
_CHUNK = 256 * 1024  # bytes of one stream in one chunk, at most
_STATEMENT = 1024 * 1024  # bytes of chunks per statement, at most
_FINAL_WAIT = 10.0  # a run's last flush: how long its result waits for it (the database may be slow or away)


def utf8_cut(data: bytes | bytearray) -> int:
    """How many bytes of ``data`` end on a UTF-8 character boundary: all of them unless it
    ends inside a multi-byte sequence (of at most 4 bytes), whose start is then held back."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: complete
            return len(data)
        if byte >= 0xC0:  # a lead byte: complete if the sequence it starts is all there
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)  # continuation bytes only (not UTF-8 here): nothing to wait for


@dataclass
class RunOutput:
    """One run's output on its way to the database; ``write`` is called from the loop."""

    execution_id: int
    attempt: int
    limit: int
    _writer: OutputWriter
    pending: dict[str, bytearray] = field(default_factory=lambda: {s: bytearray() for s in STREAMS})
    accepted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))

    def write(self, stream: str, data: bytes) -> None:
        room = self.limit - self.accepted[stream]
        if room <= 0 or not data:
            return
        data = data[:room]
        self.accepted[stream] += len(data)
        self.pending[stream] += data
        self._writer.waiting(len(data))

    def emitter(self) -> Callable[[str, bytes], None]:
        """``write`` callable from any thread (ctx.log() in a sync action runs in a pool
        thread): other threads hand the bytes to the loop, in order."""
        loop, owner = asyncio.get_running_loop(), threading.get_ident()

        def emit(stream: str, data: bytes) -> None:
            if threading.get_ident() == owner:
                self.write(stream, data)
            else:
                # An overrunning sync action may log after its worker stopped: nothing to do.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.write, stream, data)

        return emit

    def take(self, final: bool) -> list[tuple[str, bytes]]:
        """The chunks ready to send (all of them when ``final``), removed from ``pending``, each
        at most about _CHUNK bytes (a reader gets a burst of megabytes as many events)."""
        out = []
        for stream, buf in self.pending.items():
            cut = len(buf) if final else utf8_cut(buf)
            start = 0
            while start < cut:
                end = min(start + _CHUNK, cut)
                if end < cut:  # not the last piece: end it on a character boundary too
                    end = start + (utf8_cut(buf[start:end]) or end - start)
                out.append((stream, bytes(buf[start:end])))
                start = end
            del buf[:cut]
        return out


class OutputWriter:
    def __init__(self, pool: Pool, worker: str, *, limit: int, interval: float) -> None:
        self._pool = pool
        self._worker = worker
        self._limit = limit
        self._interval = interval
        self.worker_id: int | None = None
        self._runs: dict[tuple[int, int], RunOutput] = {}
        self._waiting = 0
        self._soon = asyncio.Event()
        self._lock = asyncio.Lock()  # one flush at a time: chunks of a stream stay in order

    def open(self, execution_id: int, attempt: int) -> RunOutput:
        run = RunOutput(execution_id, attempt, self._limit, self)
        self._runs[(execution_id, attempt)] = run
        return run

    def waiting(self, n: int) -> None:
        self._waiting += n
        if self._waiting >= _SOON:
            self._soon.set()

    def forget(self, run: RunOutput) -> None:
        """Drop ``run`` unsent (stopped here and released: its attempt is no longer this worker's)."""
        self._runs.pop((run.execution_id, run.attempt), None)

    async def close(self, run: RunOutput) -> None:
        """Send what is left of ``run`` (waiting at most a moment for the database), then forget it."""
        try:
            if any(run.pending.values()):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_FINAL_WAIT):
                        await self._flush([run], final=True)
        finally:
            self._runs.pop((run.execution_id, run.attempt), None)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._soon.wait()
            self._soon.clear()
            if self._waiting:
                await self._flush(list(self._runs.values()), final=False)

    async def _flush(self, runs: list[RunOutput], final: bool) -> None:
        async with self._lock:
            chunks = [(r, stream, data) for r in runs for stream, data in r.take(final)]
            if not chunks or self.worker_id is None:
                return
            self._waiting = max(0, self._waiting - sum(len(d) for _, _, d in chunks))
            # A statement of at most about _STATEMENT bytes: a run that printed megabytes
            # between two sends must not hold the loop (nor one transaction) for all of it.
            batch: list[tuple[RunOutput, str, bytes]] = []
            size = 0
            for chunk in chunks:
                if batch and size + len(chunk[2]) > _STATEMENT:
                    await self._send(batch)
                    batch, size = [], 0
                batch.append(chunk)
                size += len(chunk[2])
            await self._send(batch)

    async def _send(self, chunks: list[tuple[RunOutput, str, bytes]]) -> None:
        params = {
            "worker": self.worker_id,
            "executions": [r.execution_id for r, _, _ in chunks],
            "attempts": [r.attempt for r, _, _ in chunks],
            "streams": [s for _, s, _ in chunks],
            "chunks": [d for _, _, d in chunks],
        }
        try:
            async with self._pool.connection() as conn:
                await conn.execute(Q["append_output"], params)
        except (*SESSION_ENDED, psycopg.errors.QueryCanceled) as exc:
            # Live output is a view: its bytes are in the result too (up to the same cap).
            # Not retried, so that memory stays bounded while the database is away.
            log.warning(
                "live output not stored",
                worker=self._worker,
                error=str(exc).strip(),
                executions=sorted({r.execution_id for r, _, _ in chunks}),
            )
