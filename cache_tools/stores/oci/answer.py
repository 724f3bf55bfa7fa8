"""One registry answer being read, and the watchdog that bounds its exchange in time.

The body of a document (manifest, config, token, error) is read whole up to a limit, checked
against ``Content-Length`` before a byte is read; a blob is streamed into a file and checked
against the size and digest its descriptor declares, and no byte past that size is ever read.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import threading
from typing import Protocol

from cache_tools.errors import RemoteError, printable


class Registry(Protocol):
    """What an answer needs of the registry it came from: its two error lines."""

    def error(self, problem: str, hint: str = ...) -> RemoteError: ...

    def network_error(self, exc: BaseException, what: str,
                      watchdog: "Watchdog | None") -> RemoteError: ...


class Sink(Protocol):
    """Where a blob is streamed: a binary file, or anything that takes its bytes like one."""

    def write(self, data: bytes, /) -> int: ...


#: an error answer's body: at most this much is read for its message
MAX_ERROR_BYTES = 64 << 10
_CHUNK = 1 << 20


class Watchdog:
    """Shuts the connection's socket down once ``seconds`` have passed: every blocked read or
    write then returns, and ``fired`` says why."""

    def __init__(self, seconds: float, conn: http.client.HTTPConnection) -> None:
        self.seconds = seconds
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._timer.cancel()
        self._timer.join()       # no thread left behind: forked read workers need none


class Answer:
    """One registry answer being read: ``status``, ``header()``, and the body read bounded
    (``read``) or streamed into a file and checked (``save``).  ``close()`` always."""

    def __init__(self, registry: Registry, url: str, what: str,
                 conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                 watchdog: Watchdog) -> None:
        self.registry = registry
        self.url = url
        self.what = what
        self.status = resp.status
        self._conn = conn
        self._resp = resp
        self._watchdog = watchdog

    def header(self, name: str) -> str | None:
        return self._resp.getheader(name)

    def headers(self, name: str) -> list[str]:
        return self._resp.headers.get_all(name) or []

    @property
    def length(self) -> int | None:
        value = self.header("Content-Length")
        return int(value) if value is not None and value.strip().isdigit() else None

    def close(self) -> None:
        self._watchdog.stop()
        self._conn.close()

    def _chunk(self, n: int) -> bytes:
        try:
            data = self._resp.read1(n)
        except (OSError, http.client.HTTPException) as exc:
            raise self.registry.network_error(exc, self.what, self._watchdog) from None
        if not data and self._watchdog.fired:
            raise self.registry.network_error(TimeoutError(), self.what, self._watchdog)
        return data

    def read(self, limit: int, what: str | None = None) -> bytes:
        """The whole body, refused above ``limit`` bytes (by ``Content-Length`` before a byte
        is read; else once one byte more has come)."""
        what = what or self.what
        if self.length is not None and self.length > limit:
            raise self.registry.error(f"{what}: the answer declares {self.length} bytes, more "
                                      f"than the limit of {limit} bytes")
        parts, got = [], 0
        while got <= limit:
            data = self._chunk(min(_CHUNK, limit + 1 - got))
            if not data:
                break
            parts.append(data)
            got += len(data)
        if got > limit:
            raise self.registry.error(f"{what}: the answer holds more than the limit of "
                                      f"{limit} bytes")
        if self.length is not None and got < self.length:
            raise self.registry.error(f"{what}: the answer ended after {got} of its "
                                      f"{self.length} bytes")
        return b"".join(parts)

    def save(self, out: Sink, digest: str, size: int, what: str) -> None:
        """Exactly ``size`` bytes whose sha256 is ``digest`` into ``out``; anything else is
        refused (more data than that is never read)."""
        if self.length is not None and self.length != size:
            raise self.registry.error(f"{what}: the registry sends {self.length} bytes, the "
                                      f"manifest declares {size}")
        h = hashlib.sha256()
        got = 0
        while got <= size:
            data = self._chunk(min(_CHUNK, size + 1 - got))
            if not data:
                break
            got += len(data)
            if got > size:
                raise self.registry.error(f"{what}: the registry sends more than the {size} "
                                          "bytes the manifest declares")
            h.update(data)
            out.write(data)
        if got < size:
            raise self.registry.error(f"{what}: the registry's answer ended after {got} of "
                                      f"{size} bytes")
        if f"sha256:{h.hexdigest()}" != digest:
            raise self.registry.error(f"{what}: the content's digest is "
                                      f"sha256:{h.hexdigest()[:16]}..., not the "
                                      f"{digest[:23]}... the manifest names")

    def message(self) -> str:
        """The registry's own words for a refusal: its first error's code and message."""
        try:
            body = self.read(MAX_ERROR_BYTES)
        except RemoteError:
            return ""
        try:
            first = json.loads(body)["errors"][0]
            text = f"{first.get('code', '')}: {first.get('message', '')}".strip(": ")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
            text = body.decode("utf-8", "replace")
        text = printable(" ".join(text.split()))
        return text[:200] + ("..." if len(text) > 200 else "")
