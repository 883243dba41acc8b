"""A server-sent-events client for the integration tests: the API's streams driven over
ASGI in-process, event by event, with a disconnect at the end (``httpx``'s ASGI transport
waits for the whole body, which an open stream never sends)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from integration.api_kit import TIMEOUT


class EventStream:
    """A GET of the stream straight over ASGI: events as they are sent, then a disconnect
    (``httpx``'s ASGI transport waits for the whole body, which never comes)."""

    def __init__(self, app: FastAPI, headers: dict[str, str], path: str = "/api/v1/executions/stream") -> None:
        self.app = app
        self.path = path
        self.headers = [(k.lower().encode(), v.encode()) for k, v in {"host": "test", **headers}.items()]
        self.status: int | None = None
        self.buffer = ""
        self.events: list[dict[str, str]] = []
        self.changed = asyncio.Event()
        self.gone = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.ended = False  # the endpoint closed the stream itself

    async def __aenter__(self) -> EventStream:
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": self.path,
                 "raw_path": self.path.encode(), "query_string": b"", "root_path": "",
                 "headers": self.headers, "client": ("127.0.0.1", 50000), "server": ("test", 80),
                 "state": {}}  # fmt: skip
        asked = False

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body":
                self.ended = not message.get("more_body", False)
                self.buffer += message.get("body", b"").decode()
                while "\n\n" in self.buffer:
                    block, self.buffer = self.buffer.split("\n\n", 1)
                    fields: dict[str, str] = {}
                    for line in block.split("\n"):
                        name, _, value = line.partition(":")
                        fields[name or "comment"] = value.strip()
                    self.events.append(fields)
            self.changed.set()

        self.task = asyncio.create_task(self.app(scope, receive, send))
        return self

    async def wait_for(self, predicate: Callable[[dict[str, str]], bool], timeout: float = TIMEOUT) -> dict[str, str]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                assert self.task is not None
                if self.task.done():
                    raise AssertionError(f"the stream ended: {self.task.result()!r}, {self.events}")
                self.changed.clear()
                await self.changed.wait()

    async def __aexit__(self, *exc: object) -> None:
        self.gone.set()
        assert self.task is not None
        async with asyncio.timeout(TIMEOUT):  # the endpoint stops once the client is gone
            await self.task
