"""Reading an execution's live output (issue #15): the chunks a running execution's worker
sends as the action prints (``execution_output``, migration 0029), from a cursor, and
following them until the execution ends. Used by ``conveyor executions tail`` and the API.

    with Client(url) as client:
        for chunk in client.follow_output(execution_id):
            print(chunk.text(), end="")
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from conveyor.domain.errors import ExecutionNotFoundError
from conveyor.store.db import Conn, channel
from conveyor.store.queries import Q
from conveyor.store.wakeups import Topic

_PAGE = 1000
_RECHECK = 1.0  # seconds between reads while nothing is heard (a NOTIFY lost with a connection)


@dataclass(frozen=True, slots=True)
class OutputChunk:
    id: int  # the cursor: chunks after this one come next (an SSE event id)
    attempt: int
    stream: str  # stdout, stderr or log
    data: bytes  # as the action wrote it
    created: datetime

    def text(self) -> str:
        """The bytes as text: UTF-8, with what is not valid UTF-8 as \\xNN escapes (the
        worker cuts chunks on character boundaries, so valid text is never split)."""
        return self.data.decode("utf-8", "backslashreplace")


class OutputMethods:
    conn: Conn
    schema: str

    def output(self, execution_id: int, *, after: int = 0, limit: int = _PAGE) -> tuple[list[OutputChunk], bool]:
        """(chunks after the cursor ``after``, in order, at most ``limit``; whether the
        execution has ended). ExecutionNotFoundError for an unknown execution."""
        rows = self.conn.execute(Q["execution_output"], {"id": execution_id, "after": after, "limit": limit}).fetchall()
        if not rows:
            raise ExecutionNotFoundError(execution_id)
        ended = bool(rows[0]["ended"])
        chunks = [
            OutputChunk(r["id"], r["attempt"], r["stream"], bytes(r["data"]), r["created"])
            for r in rows
            if r["id"] is not None
        ]
        return chunks, ended

    def follow_output(self, execution_id: int, *, after: int = 0, follow: bool = True) -> Iterator[OutputChunk]:
        """Every chunk after ``after``; with ``follow``, then each new one as it is stored,
        until the execution has ended and all of it has been read (woken by NOTIFY)."""
        # New output, and the end (the last chunks are stored before the result).
        channels = [sql.Identifier(channel(self.schema, topic)) for topic in (Topic.OUTPUT, Topic.COMPLETED)]
        if follow:
            for name in channels:
                self.conn.execute(sql.SQL("LISTEN {}").format(name))
        try:
            while True:
                chunks, ended = self.output(execution_id, after=after)
                yield from chunks
                if chunks:
                    after = chunks[-1].id
                if len(chunks) == _PAGE:
                    continue  # more to read now
                if not follow or ended:
                    return
                # Any execution's new output or end wakes this (one read: cheap); the timeout
                # covers a notification lost with a connection.
                for _ in self.conn.notifies(timeout=_RECHECK, stop_after=1):
                    pass
        finally:
            if follow:
                for name in channels:
                    self.conn.execute(sql.SQL("UNLISTEN {}").format(name))
