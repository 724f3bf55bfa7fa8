"""The sidecar's HTTP endpoints (``/ready`` ``/live`` ``/metrics`` ``/report``) and the server
that answers them (the standard library's ``ThreadingHTTPServer``)."""

from __future__ import annotations

import json
import logging
import socket
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

logger = logging.getLogger("sglang_warmup.sidecar")

ENDPOINTS: tuple[str, ...] = ("/ready", "/live", "/metrics", "/report")


@dataclass(frozen=True)
class Answer:
    """One response: status, body and its content type."""

    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, doc: Any) -> "Answer":
        return cls(status, (json.dumps(doc, indent=1, default=str) + "\n").encode())


def route(sidecar: Any, path: str) -> Answer:
    """The answer of ``GET path`` from the sidecar's state (``status()``, ``live``, ``state``,
    ``metrics_text()``)."""
    if path == "/ready":
        st = sidecar.status()
        return Answer.json(200 if st["ready"] else 503,
                           {"ready": st["ready"], "state": st["state"], "reason": st["reason"]})
    if path == "/live":
        live = sidecar.live
        return Answer.json(200 if live else 503, {"live": live, "state": sidecar.state})
    if path == "/report":
        return Answer.json(200, sidecar.status())
    if path == "/metrics":
        from prometheus_client import CONTENT_TYPE_LATEST

        return Answer(200, sidecar.metrics_text(), CONTENT_TYPE_LATEST)
    return Answer.json(404, {"error": f"no such endpoint {path}", "endpoints": list(ENDPOINTS)})


class _Handler(BaseHTTPRequestHandler):
    server_version = "sglang-warmup-sidecar"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = urllib.parse.urlparse(self.path).path.rstrip("/") or "/"
        try:
            answer = self.server.answer(path)  # type: ignore[attr-defined]
        except Exception as exc:  # answer something rather than drop the connection
            logger.warning("sglang-warmup sidecar: %s failed: %r", path, exc)
            answer = Answer.json(500, {"error": f"{type(exc).__name__}: {exc}"})
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        logger.debug("sglang-warmup sidecar: %s %s", self.address_string(), format % args)


class EndpointServer(ThreadingHTTPServer):
    """Listens on ``(host, port)`` and answers ``GET`` with ``answer(path)``."""

    daemon_threads = True

    def __init__(self, host: str, port: int, answer: Callable[[str], Answer]) -> None:
        self.answer = answer
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
