"""A real HTTP server on 127.0.0.1 (a free port) in a daemon thread, for the tests of our HTTP
clients: the caller writes the handler, this owns the socket, the thread and the shutdown."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class LocalServer:
    """``LocalServer(Handler)``: serving at :attr:`url` until :meth:`close`.  ``backlog``: the
    listen queue (a test that opens many connections at once measures the client, not this
    server); ``quiet``: no traceback for clients that timed out and left."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, backlog: int = 5,
                 quiet: bool = False) -> None:
        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = backlog

        self.httpd = Server(("127.0.0.1", 0), handler)
        if quiet:
            self.httpd.handle_error = lambda request, address: None
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def responding(respond: Callable[[BaseHTTPRequestHandler], None], **options: Any) -> LocalServer:
    """A LocalServer whose every GET and POST is answered by ``respond(handler)``; a POST's body
    is read first (``handler.body``: its bytes)."""

    class Handler(BaseHTTPRequestHandler):
        body = b""

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            respond(self)

        def do_POST(self) -> None:  # noqa: N802
            self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            respond(self)

    return LocalServer(Handler, **options)
