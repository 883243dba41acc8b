"""Request body size limit as plain ASGI middleware: checked against Content-Length
before reading, and counted while streaming for bodies without one. JSON bodies are
read within the ``documents`` bounds (depth, nodes, text, no key named twice)."""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from conveyor.domain.documents import DEFAULT_LIMITS, DocumentError, Limits, load_json

Scope = dict[str, Any]
Message = dict[str, Any]


def _too_large(max_bytes: int) -> str:
    return f"request body too large: the limit is {max_bytes} bytes (api.max_body_bytes)"


class BodyTooLargeError(HTTPException):
    """An HTTPException, so that the framework's body parsing passes it on (as a 413)
    instead of turning every read error into "400 There was an error parsing the body"."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _too_large(max_bytes))


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLargeError(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLargeError:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        await _answer(send, 413, _too_large(self.max_bytes))


async def _answer(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _webhook_door(scope: Scope) -> bool:
    parts = scope["path"].split("/")  # ['', 'api', 'v1', 'webhooks', name]
    return scope["method"] == "POST" and len(parts) == 5 and parts[1:4] == ["api", "v1", "webhooks"]


class JsonBodies:
    """The API takes JSON only, whatever Content-Type says: ``curl -d '{...}'`` sends
    ``application/x-www-form-urlencoded``, and the seeds' example must work verbatim.
    Not a webhook's door (``POST /api/v1/webhooks/{name}``): it reads the sender's
    Content-Type itself (GitHub may send its form encoding), which reads within the same
    bounds itself.

    Every such body that is JSON is checked against the ``documents`` bounds before a
    route sees it (400 with the bound's name): FastAPI's own parsing has none, and turns a
    RecursionError into "There was an error parsing the body". A body that is not JSON
    (a rule's YAML) is left to its route, which reads it within the same bounds.

    FastAPI parses the body again for its route (``await request.json()`` on a Request it
    builds itself: Starlette and FastAPI offer no way to hand it a value parsed here short
    of a custom Request and APIRoute class on every router). Left so because that second
    parse is C and cheap next to the check: for 1 MiB bodies, measured best of 7, it takes
    0.7 ms (one string), 4.2 ms (30,000 keys) and 8.2 ms (99,000 short strings), against
    0.7, 41 and 167 ms for :func:`load_json` here (in a worker thread). A body that gets
    past the check has at most ``documents.max_nodes`` values, which bounds the second
    parse on the event loop too."""

    def __init__(self, app: Any, limits: Limits = DEFAULT_LIMITS) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].startswith("/api/")
            and scope["method"] in ("POST", "PUT", "PATCH")
            and not _webhook_door(scope)
        ):
            headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
            messages = await _read_all(receive)  # bounded by BodyLimit, which runs first
            body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
            problem = await self._problem(body)
            if problem is not None:
                await _answer(send, 400, problem)
                return
            receive = _replay(messages, receive)
        await self.app(scope, receive, send)

    async def _problem(self, body: bytes) -> str | None:
        if len(body) <= INLINE_BYTES:
            return _json_problem(body, self.limits)
        # Parsing megabytes is CPU work: off the event loop, which answers /health/live.
        return await run_in_threadpool(_json_problem, body, self.limits)


# Bytes of a document read on the event loop (well under a millisecond); a larger one is
# read in a worker thread, so that the loop keeps answering /health/live meanwhile.
INLINE_BYTES = 64 * 1024


def _json_problem(body: bytes, limits: Limits) -> str | None:
    try:
        load_json(body, limits)
    except DocumentError as exc:
        return f"request body refused: {exc}"
    except ValueError:  # not JSON (or not UTF-8): the route answers it as it always did
        return None
    return None


async def _read_all(receive: Any) -> list[Message]:
    messages: list[Message] = []
    while True:
        message: Message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Any) -> Any:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
