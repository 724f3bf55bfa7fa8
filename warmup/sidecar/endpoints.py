"""The sidecar's HTTP endpoints (``/ready`` ``/live`` ``/metrics`` ``/report``) and the small
server that answers them without letting any client starve it.

A probe must be answered even while other clients misbehave (idle connections, requests sent a
byte at a time, oversized headers, other protocols): one thread reads request heads for every
connection with a selector, so an idle or slow client costs a buffer and a file descriptor, not
a thread.  That thread also refuses, as soon as it can tell, what is no HTTP/1.x request (a TLS
hello, an HTTP/0.9 line: 400), a head too large (431, or 400 for the request line), and a head
not complete within ``head_timeout_s`` (408); complete requests go to a fixed pool of worker
threads.  Connections are bounded (the oldest one still sending its head is dropped for a new
one), and every answer closes its connection.  Standard library only.
"""

from __future__ import annotations

import http
import json
import logging
import queue
import re
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
#: A request line as this server reads it: a method token, a target, HTTP/1.x (a bare LF ends a
#: line as well as CR LF does); the method alone, while the line is still arriving.
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb"{1,32}) (\S+) HTTP/1\.[0-9]\r?")
_METHOD_SO_FAR = re.compile(_TOKEN + rb"{0,32}")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
#: How long a refused client may go on sending (read and dropped) before it is closed: closing
#: with unread data would reset the connection before the client reads the answer.
_LINGER_S = 1.0


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
        # Insertion order is accept order, so the first entry has the earliest deadline; the same
        # for refused connections lingering until their client stops sending.
        self._pending: dict[socket.socket, _Pending] = {}
        self._lingering: dict[socket.socket, _Pending] = {}
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
                for waiting in (self._pending, self._lingering):
                    if waiting:
                        first = next(iter(waiting.values()))
                        timeout = min(timeout, max(0.0, first.deadline - time.monotonic()))
                for key, _ in sel.select(timeout):
                    if key.data == "accept":
                        self._accept(sel)
                    elif key.data == "wake":
                        _drain(self._wake_r)
                    else:
                        self._read(sel, key.data)
                self._expire(sel, time.monotonic())
        finally:
            for p in [*self._pending.values(), *self._lingering.values()]:
                self._drop(sel, p)
            sel.close()
            self._stopped.set()

    def _expire(self, sel: selectors.BaseSelector, now: float) -> None:
        """A head not complete in time is answered 408; a refused client's time is up."""
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                break
            self._refuse(sel, p, 408, f"no complete request within {self.limits.head_timeout_s:g} s")
        while self._lingering:
            p = next(iter(self._lingering.values()))
            if p.deadline > now:
                break
            self._drop(sel, p)

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
            while (oldest := self._oldest_waiting()) is not None and \
                    self._open(busy) >= self.limits.max_connections:
                logger.debug("%s: %d connections open; dropping %s, the oldest still sending "
                             "its request", self.name, self._open(busy), oldest.peer)
                self._drop(sel, oldest)
            if self._open(busy) >= self.limits.max_connections:
                sock.close()  # every slot answers a complete request right now
                continue
            sock.setblocking(False)
            p = _Pending(sock, peer, time.monotonic() + self.limits.head_timeout_s)
            self._pending[sock] = p
            sel.register(sock, selectors.EVENT_READ, p)

    def _open(self, busy: int) -> int:
        return len(self._pending) + len(self._lingering) + busy

    def _oldest_waiting(self) -> _Pending | None:
        """The connection to drop for a new one: a refused one lingering, else the oldest still
        sending its head."""
        for waiting in (self._lingering, self._pending):
            if waiting:
                return next(iter(waiting.values()))
        return None

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
        if p.sock in self._lingering:  # what a refused client still sends is dropped
            return
        p.buf += data
        refusal = self._refusal(p.buf)
        if refusal is not None:
            self._refuse(sel, p, *refusal)
            return
        if _HEAD_END.search(p.buf) is not None:
            match = _REQUEST_LINE.match(p.buf)  # the whole line was checked by _refusal
            assert match is not None
            method, target = match.group(1).decode("ascii"), match.group(2).decode("latin-1")
            self._dispatch(sel, p, lambda: self._answer(p, method, target))

    def _refusal(self, buf: bytes) -> tuple[int, str] | None:
        """Why the request head arriving in ``buf`` is refused now (status, reason); None while
        it may still become a request.  A request line is judged as soon as its method (a TLS
        hello's first byte) or its end (an HTTP/0.9 line) is there."""
        lim = self.limits
        line_end = buf.find(b"\n")
        line = buf if line_end < 0 else buf[:line_end]
        if len(line) > lim.max_request_line:
            return 400, "request line too long"
        if line_end < 0:
            if not _METHOD_SO_FAR.fullmatch(line.split(b" ", 1)[0]):
                return 400, "malformed request line"
            return None
        if not _REQUEST_LINE.fullmatch(line):
            return 400, "malformed request line (an HTTP/1.x request is expected)"
        end = _HEAD_END.search(buf)
        if (end.end() if end is not None else len(buf)) > lim.max_head_bytes:
            return 431, "request headers too large"
        return None

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
        self._lingering.pop(p.sock, None)
        p.sock.close()

    def _refuse(self, sel: selectors.BaseSelector, p: _Pending, status: int, why: str) -> None:
        """Answer ``status`` from this thread (an answer this small fits the socket's empty
        buffer: no worker waits on a client that may never read), then linger: what the client
        still sends is read and dropped for ``_LINGER_S`` at most, and the connection closed."""
        logger.debug("%s: %s: %d %s", self.name, p.peer, status, why)
        try:
            p.sock.send(self._encode(Answer.json(status, {"error": why})))
            p.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(sel, p)
            return
        del self._pending[p.sock]
        p.buf, p.deadline = b"", time.monotonic() + _LINGER_S
        self._lingering[p.sock] = p

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

    def _answer(self, p: _Pending, method: str, target: str) -> None:
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

    def _encode(self, answer: Answer, *, head_only: bool = False, extra: str = "") -> bytes:
        phrase = http.HTTPStatus(answer.status).phrase
        head = (f"HTTP/1.1 {answer.status} {phrase}\r\nServer: {self.name}\r\n"
                f"Date: {formatdate(usegmt=True)}\r\nContent-Type: {answer.content_type}\r\n"
                f"Content-Length: {len(answer.body)}\r\nCache-Control: no-store\r\n{extra}"
                "Connection: close\r\n\r\n").encode("latin-1")
        return head if head_only else head + answer.body

    def _send(self, p: _Pending, answer: Answer, *, head_only: bool = False,
              extra: str = "") -> None:
        """Send a complete request's answer from a worker, within ``write_timeout_s``."""
        sock = p.sock
        try:
            sock.setblocking(True)
            sock.settimeout(self.limits.write_timeout_s)
            sock.sendall(self._encode(answer, head_only=head_only, extra=extra))
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
