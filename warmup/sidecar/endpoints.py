"""The sidecar's HTTP endpoints (``/ready`` ``/live`` ``/metrics`` ``/report``) and the small
server that answers them without letting any client starve it.

A probe must be answered even while other clients misbehave (idle connections, requests sent a
byte at a time, oversized headers): one thread reads request heads for every connection with a
selector, so an idle or slow client costs a buffer and a file descriptor, not a thread, and is
closed when its head is not complete within ``head_timeout_s``; complete requests go to a fixed
pool of worker threads.  Connections are bounded (the oldest one still sending its head is
dropped for a new one), request heads are bounded (431, or 400 for a request line alone too
long), and every answer closes its connection.  Standard library only.
"""

from __future__ import annotations

import http
import json
import logging
import queue
import selectors
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Callable

logger = logging.getLogger("sglang_warmup.sidecar")

ENDPOINTS: tuple[str, ...] = ("/ready", "/live", "/metrics", "/report")


@dataclass(frozen=True)
class Limits:
    """What one client may cost the server.

    ``head_timeout_s``: from connect to the end of the request's headers (a slow or idle client
    is closed then).  ``max_request_line`` / ``max_head_bytes``: the request line alone / the
    line and headers together.  ``max_connections``: open connections at once (past it the
    oldest one still sending its head is dropped).  ``workers``: threads answering complete
    requests.  ``backlog``: the listen queue.  ``write_timeout_s``: for sending one answer.
    """

    head_timeout_s: float = 5.0
    max_request_line: int = 4096
    max_head_bytes: int = 8192
    max_connections: int = 512
    workers: int = 4
    backlog: int = 1024
    write_timeout_s: float = 5.0


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


class _Pending:
    """A connection whose request head is still arriving."""

    __slots__ = ("sock", "peer", "deadline", "buf")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float) -> None:
        self.sock, self.peer, self.deadline, self.buf = sock, peer, deadline, b""


class EndpointServer:
    """Listens on ``(host, port)`` and answers ``GET``/``HEAD`` with ``handle(path)``.
    :meth:`serve_forever` runs the reading loop (in a thread of the caller's);
    :meth:`shutdown` stops it, :meth:`server_close` releases everything.  Raises OSError when
    the address cannot be bound."""

    def __init__(self, host: str, port: int, handle: Callable[[str], Answer], *,
                 limits: Limits = Limits(), name: str = "sglang-warmup-sidecar") -> None:
        self.handle = handle
        self.limits = limits
        self.name = name
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host.strip("[]"), port))
            self._listener.listen(limits.backlog)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = threading.Event()
        self._running = threading.Event()
        self._stopped = threading.Event()
        # Insertion order is accept order, so the first entry has the earliest deadline.
        self._pending: dict[socket.socket, _Pending] = {}
        self._accept_warned = 0.0  # when accept() failing was last logged (monotonic)
        self._busy = 0  # connections handed to the workers and not closed yet
        self._busy_lock = threading.Lock()
        self._jobs: "queue.SimpleQueue[Callable[[], None] | None]" = queue.SimpleQueue()
        self._workers = [threading.Thread(target=self._work, name=f"{name}-http-{i}", daemon=True)
                         for i in range(max(1, limits.workers))]
        for w in self._workers:
            w.start()

    # --- lifecycle ----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._running.set()
        try:
            while not self._stopping.is_set():
                timeout = 1.0
                if self._pending:
                    oldest = next(iter(self._pending.values()))
                    timeout = min(timeout, max(0.0, oldest.deadline - time.monotonic()))
                for key, _ in sel.select(timeout):
                    if key.data == "accept":
                        self._accept(sel)
                    elif key.data == "wake":
                        _drain(self._wake_r)
                    else:
                        self._read(sel, key.data)
                now = time.monotonic()
                while self._pending:
                    p = next(iter(self._pending.values()))
                    if p.deadline > now:
                        break
                    logger.debug("%s: closing %s: no complete request within %g s", self.name,
                                 p.peer, self.limits.head_timeout_s)
                    self._drop(sel, p)
        finally:
            for p in list(self._pending.values()):
                self._drop(sel, p)
            sel.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait until it returned (when it runs)."""
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._running.is_set() and not self._stopped.wait(5.0):
            logger.debug("%s: the reading loop did not stop within 5 s", self.name)

    def server_close(self) -> None:
        self._stopping.set()
        for _ in self._workers:
            self._jobs.put(None)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    # --- reading request heads ----------------------------------------------------------------
    def _accept(self, sel: selectors.BaseSelector) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: make room, try later
                now = time.monotonic()
                if now - self._accept_warned >= 10.0:
                    self._accept_warned = now
                    logger.warning("%s: accept failed: %s", self.name, exc)
                if self._pending:
                    self._drop(sel, next(iter(self._pending.values())))
                else:
                    time.sleep(0.05)  # nothing to free: do not spin on a listener still ready
                return
            with self._busy_lock:
                busy = self._busy
            while self._pending and len(self._pending) + busy >= self.limits.max_connections:
                oldest = next(iter(self._pending.values()))
                logger.debug("%s: %d connections open; dropping %s, the oldest still sending "
                             "its request", self.name, len(self._pending) + busy, oldest.peer)
                self._drop(sel, oldest)
            if len(self._pending) + busy >= self.limits.max_connections:
                sock.close()  # every slot answers a complete request right now
                continue
            sock.setblocking(False)
            p = _Pending(sock, peer, time.monotonic() + self.limits.head_timeout_s)
            self._pending[sock] = p
            sel.register(sock, selectors.EVENT_READ, p)

    def _read(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        try:
            data = p.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, p)
            return
        p.buf += data
        lim = self.limits
        end = p.buf.find(b"\r\n\r\n")
        line_end = p.buf.find(b"\n")
        if (line_end < 0 and len(p.buf) > lim.max_request_line) or line_end > lim.max_request_line:
            self._dispatch(sel, p, lambda: self._reject(p, 400, "request line too long"))
        elif (end < 0 and len(p.buf) > lim.max_head_bytes) or end + 4 > lim.max_head_bytes:
            self._dispatch(sel, p, lambda: self._reject(p, 431, "request headers too large"))
        elif end >= 0:
            head = p.buf[:end]
            self._dispatch(sel, p, lambda: self._answer(p, head))

    def _dispatch(self, sel: selectors.BaseSelector, p: _Pending, job: Callable[[], None]) -> None:
        sel.unregister(p.sock)
        del self._pending[p.sock]
        with self._busy_lock:
            self._busy += 1
        self._jobs.put(job)

    def _drop(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        try:
            sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        self._pending.pop(p.sock, None)
        p.sock.close()

    # --- answering (worker threads) -----------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # one bad connection never ends a worker
                logger.debug("%s: answering failed: %r", self.name, exc)
            finally:
                with self._busy_lock:
                    self._busy -= 1

    def _answer(self, p: _Pending, head: bytes) -> None:
        try:
            line = head.split(b"\n", 1)[0].decode("latin-1").strip()
            method, target, version = line.split(" ")
            if not version.startswith("HTTP/"):
                raise ValueError(version)
        except ValueError:
            self._reject(p, 400, "malformed request line")
            return
        if method not in ("GET", "HEAD"):
            self._send(p, Answer.json(405, {"error": f"method {method[:16]} not allowed",
                                            "allowed": ["GET", "HEAD"]}),
                       extra="Allow: GET, HEAD\r\n")
            return
        path = urllib.parse.urlsplit(target).path.rstrip("/") or "/"
        try:
            answer = self.handle(path)
        except Exception as exc:  # answer something rather than drop the connection
            logger.warning("%s: %s failed: %r", self.name, path, exc)
            answer = Answer.json(500, {"error": f"{type(exc).__name__}: {exc}"})
        logger.debug("%s: %s %s %s -> %d", self.name, p.peer, method, path, answer.status)
        self._send(p, answer, head_only=method == "HEAD")

    def _reject(self, p: _Pending, status: int, why: str) -> None:
        logger.debug("%s: %s: %d %s", self.name, p.peer, status, why)
        self._send(p, Answer.json(status, {"error": why}), linger=True)

    def _send(self, p: _Pending, answer: Answer, *, head_only: bool = False, extra: str = "",
              linger: bool = False) -> None:
        phrase = http.HTTPStatus(answer.status).phrase
        head = (f"HTTP/1.1 {answer.status} {phrase}\r\nServer: {self.name}\r\n"
                f"Date: {formatdate(usegmt=True)}\r\nContent-Type: {answer.content_type}\r\n"
                f"Content-Length: {len(answer.body)}\r\nCache-Control: no-store\r\n{extra}"
                "Connection: close\r\n\r\n").encode("latin-1")
        sock = p.sock
        try:
            sock.setblocking(True)
            sock.settimeout(self.limits.write_timeout_s)
            sock.sendall(head if head_only else head + answer.body)
            if linger:
                # The client may still be sending what we refused; closing with unread data
                # would reset the connection before it reads the answer.  Read for 1 s at most.
                sock.shutdown(socket.SHUT_WR)
                end = time.monotonic() + 1.0
                while (left := end - time.monotonic()) > 0:
                    sock.settimeout(left)
                    if not sock.recv(4096):
                        break
        except OSError:
            pass
        finally:
            sock.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except (BlockingIOError, InterruptedError, OSError):
        pass
