"""SGLang's own HTTP app, called in-process over ASGI: the streamed plan requests' way in.

The plan runs inside the server before its port opens, through the tokenizer manager
(:class:`~warmup.serve.transport.InProcessTransport`).  Nothing of the HTTP layer runs then,
and SGLang's own warm-up request after the port opens is not streamed, so the first streamed
``/generate`` after ready paid the event-stream path's first use: Starlette's
``StreamingResponse`` runs the stream beside a disconnect listener in an anyio task group, and
anyio imports its asyncio backend on that first use (docs/first-hits.md, "Streaming": 15-22 ms
on the GPU rig, outside SGLang's own latency).

So a streamed plan request goes through SGLang's app itself: the same route, middleware
(API key included), request validation, SSE encoding and ``StreamingResponse``, with no socket.
The scope is the one uvicorn builds (ASGI 3.0, spec 2.3), so Starlette takes the path it takes
for a real client, and the answer is the client's once its last byte is sent, as over a socket:
what the app does after it (SGLang's ``/generate`` runs a background task, two seconds' sleep
and then an abort that finds the request finished) goes on without the warm-up waiting for it.
The app is SGLang's only when its HTTP server module is loaded and serves the very tokenizer
manager the warm-up was given (``_global_state.tokenizer_manager``); anywhere else
:func:`of_server` returns None and the request goes to the tokenizer manager as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from warmup.errors import HttpAppError, TransportError
from warmup.serve.http import MAX_STREAM_LINE_BYTES, SNIPPET_CHARS, snippet, sse_chunk

logger = logging.getLogger("sglang_warmup.asgi")

#: SGLang's HTTP server: its module-level FastAPI ``app`` and ``_global_state``.
HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


@dataclass(frozen=True)
class AsgiApp:
    """An ASGI app and the headers every request to it carries."""

    app: App
    headers: tuple[tuple[bytes, bytes], ...] = ()

    async def stream(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST body`` to ``path`` as a streaming client: the last SSE chunk's output dict.
        An app that answers nothing, or a status other than 200, raises :class:`HttpAppError`
        (the app could not carry the request); after a 200, an error inside the stream, an app
        that raises or a stream without output raise :class:`TransportError`."""
        what = f"POST {path} (in-process HTTP)"
        try:
            payload = json.dumps(body, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:    # not a JSON body: the app cannot carry it
            raise HttpAppError(f"{what}: the request is not JSON ({snippet(str(exc))})",
                               hint="report this with the plan") from None
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
                 "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [*self.headers, (b"content-length", str(len(payload)).encode())],
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "state": {}}
        answer = _Answer(what)
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await answer.done.wait()            # the client stays until the answer ends
            return {"type": "http.disconnect"}

        app = asyncio.ensure_future(self.app(scope, receive, answer.send))
        ended = asyncio.ensure_future(answer.done.wait())
        try:
            await asyncio.wait((app, ended), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:                   # cancelled (the request's timeout): all of it
            app.cancel()
            raise
        finally:
            ended.cancel()
        if not app.done():                      # answered; the app's background work goes on
            _after_answer(app, what)
        elif not app.cancelled() and (failure := app.exception()) is not None and answer.error is None:
            answer.done.set()
            kind = TransportError if answer.status == 200 else HttpAppError
            raise kind(f"{what} raised {type(failure).__name__}: {snippet(str(failure))}",
                       hint="see the server log")
        answer.done.set()
        return answer.result()


#: The apps still running after their answer ended (SGLang's ``/generate`` then runs a
#: background task: ``TokenizerManager.create_abort_task``, two seconds' sleep, then an abort
#: that finds the request finished).  A real client has its answer by then; so has ours.  Held
#: here because the event loop keeps only weak references to tasks.
_running: set[asyncio.Future] = set()


def _after_answer(app: asyncio.Future, what: str) -> None:
    """Let ``app`` finish on its own; a failure then is logged, never raised."""
    def settled(task: asyncio.Future) -> None:
        _running.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning("sglang-warmup: %s failed after its answer: %s: %s", what,
                           type(exc).__name__, snippet(str(exc)))

    _running.add(app)
    app.add_done_callback(settled)


class _Answer:
    """The response side of one request: the status, the SSE lines as they come (the last
    chunk kept, nothing else), and the first error, raised once the answer has ended or the
    app has returned."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.status: int | None = None
        self.pending = bytearray()             # an SSE line not ended yet, or an error body
        self.last: dict[str, Any] | None = None
        self.error: TransportError | None = None
        self.done = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self.status = int(message.get("status", 0))
        elif kind == "http.response.body":
            if self.error is None:
                self._take(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.done.set()

    def _take(self, data: bytes) -> None:
        self.pending += data
        if self.status != 200:                  # an error body: its start is all we quote
            del self.pending[SNIPPET_CHARS * 4:]
            return
        try:
            while (end := self.pending.find(b"\n")) >= 0:
                line = bytes(self.pending[:end + 1])
                del self.pending[:end + 1]
                chunk = sse_chunk(line)
                if chunk is not None:
                    self.last = chunk
            if len(self.pending) > MAX_STREAM_LINE_BYTES:
                raise TransportError(f"{self.what} answered a line longer than "
                                     f"{MAX_STREAM_LINE_BYTES:,} bytes", hint="see the server log")
        except TransportError as exc:
            self.error = exc
            self.pending.clear()

    def result(self) -> dict[str, Any]:
        if self.error is None and self.status == 200 and self.pending:
            self._take(b"\n")                   # a last line without its line end
        if self.error is not None:
            raise self.error
        if self.status is None:
            raise HttpAppError(f"{self.what} answered nothing", hint="see the server log")
        if self.status != 200:
            raise HttpAppError(f"{self.what} answered HTTP {self.status}: "
                               f"{snippet(bytes(self.pending))}", hint="see the server log")
        if self.last is None:
            raise TransportError(f"{self.what} answered no output", hint="see the server log")
        return self.last


def of_server(tokenizer_manager: Any) -> AsgiApp | None:
    """SGLang's HTTP app, where it serves ``tokenizer_manager`` in this process; its API key
    (``--api-key``) goes in every request's headers.  None elsewhere."""
    module = sys.modules.get(HTTP_SERVER_MODULE)
    app = getattr(module, "app", None)
    state = getattr(module, "_global_state", None)
    if not callable(app) or getattr(state, "tokenizer_manager", None) is not tokenizer_manager:
        return None
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]
    api_key = getattr(getattr(tokenizer_manager, "server_args", None), "api_key", None)
    if isinstance(api_key, str) and api_key:
        headers.append((b"authorization", f"Bearer {api_key}".encode()))
    return AsgiApp(app, tuple(headers))
