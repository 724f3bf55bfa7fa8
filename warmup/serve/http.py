"""The HTTP client: the one way sglang-warmup talks to an SGLang server over HTTP.

:class:`HttpClient` holds the base URL, the API key (a Bearer token on every call), the timeout
and the retry policy; :meth:`HttpClient.request` is the one place a request is made.  Every call
has a timeout; only idempotent reads are retried (HTTP 5xx and connection errors, with
exponential backoff).  On top: :meth:`~HttpClient.probe` (never raises, for health checks),
:meth:`~HttpClient.server_info` (``/server_info``, falling back to ``/get_server_info`` on
servers that predate it), :meth:`~HttpClient.generate` (an ``{"error": ...}`` body is an error
even with HTTP 200, as a proxy in front of SGLang answers), :meth:`~HttpClient.stream` (SSE) and
:meth:`~HttpClient.flush` and :meth:`~HttpClient.freeze_gc`.  :func:`wait_for_health` probes
with backoff until a deadline.

Text that comes from the server is shown through :func:`printable`: control characters are
escaped, never echoed raw into an error line or a log.  Standard library only (the sidecar's
slim image has nothing else for this).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from cache_tools.errors import printable
from warmup.errors import TransportError

logger = logging.getLogger("sglang_warmup.http")

SNIPPET_CHARS = 200  # of a server's answer quoted in an error line
#: The most bytes of one answer read from the server: a logprob answer for a long prompt can be
#: tens of MiB; a larger one is refused, never held whole.
MAX_RESPONSE_BYTES = 256 << 20
#: The longest line of a streamed answer (one SSE chunk, its line end included).
MAX_STREAM_LINE_BYTES = 64 << 20


def snippet(payload: bytes | str, limit: int = SNIPPET_CHARS) -> str:
    """The start of a server's answer, printable, on one line (``…`` when cut)."""
    text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
    text = printable(text.strip())
    return text if len(text) <= limit else text[:limit] + "…"


def read_body(resp: Any, what: str) -> bytes:
    """The body of an answer (a response or an HTTPError), at most :data:`MAX_RESPONSE_BYTES`;
    one byte more is a TransportError naming ``what`` (``METHOD /path``) and the limit."""
    data = resp.read(MAX_RESPONSE_BYTES + 1)
    if len(data) > MAX_RESPONSE_BYTES:
        raise TransportError(f"{what} answered more than {MAX_RESPONSE_BYTES:,} bytes",
                             hint="is --url an SGLang server?")
    return data


def error_message(error: Any) -> str:
    """The printable text of an SGLang ``{"error": ...}`` payload (a string or
    ``{"message": ...}``)."""
    if isinstance(error, dict) and error.get("message"):
        return snippet(str(error["message"]), 500)
    return snippet(error if isinstance(error, str) else json.dumps(error, default=str), 500)


def sse_chunk(raw: bytes, not_sglang_hint: str = "is the server SGLang?") -> dict[str, Any] | None:
    """One line of SGLang's streamed ``/generate`` (server-sent events): the output dict of a
    ``data:`` line, None for any other line and for ``data: [DONE]``.  An error SGLang reports
    inside the stream (after its 200), or a chunk that is not JSON (``not_sglang_hint``: the
    caller's words for the fix), raises."""
    line = raw.decode(errors="replace").strip()
    if not line.startswith("data:") or line == "data: [DONE]":
        return None
    try:
        chunk = json.loads(line[5:])
    except (ValueError, RecursionError):
        raise TransportError("/generate (stream) answered a chunk that is not JSON",
                             hint=not_sglang_hint) from None
    if isinstance(chunk, dict) and "error" in chunk:
        raise TransportError(f"/generate (stream) answered an error: "
                             f"{error_message(chunk['error'])}", hint="see the server log")
    return chunk if isinstance(chunk, dict) else {}


# --- probes and waiting for health --------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """One HTTP probe: ``status`` (None when nothing answered) and a short ``detail``."""

    status: int | None
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == 200


def _reason(reason: Any, timeout: float) -> str:
    """A short reason for a failed connection (``connection refused``, ``no answer within 2 s``)."""
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, ConnectionResetError):
        return "connection reset"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return printable(str(reason)) or type(reason).__name__


@dataclass(frozen=True)
class HealthWait:
    """How a wait for health ended.  ``ended``: ``healthy``, ``deadline``, ``stopped`` or the
    message of the ``alive`` check that ended it (e.g. the server process exited)."""

    ok: bool
    ended: str
    waited_s: float
    attempts: int
    last: str


def wait_for_health(probe: Callable[[float], Probe], deadline_s: float, *,
                    initial_s: float = 0.5, max_s: float = 10.0, probe_timeout_s: float = 30.0,
                    stop: threading.Event | None = None,
                    alive: Callable[[], str | None] | None = None,
                    what: str = "the server", log_every_s: float = 30.0,
                    log: logging.Logger | None = None) -> HealthWait:
    """Probe until one answers 200, with exponential backoff (``initial_s`` doubling up to
    ``max_s``) and a hard ``deadline_s``: no probe and no sleep reaches past it.  ``alive``
    returns None while the thing probed may still come up, else why it cannot (ends the wait)."""
    log = log or logger
    start = time.monotonic()
    end = start + deadline_s
    delay = initial_s
    attempts = 0
    last = "not probed yet"
    next_log = start + log_every_s

    def result(ok: bool, ended: str) -> HealthWait:
        return HealthWait(ok, ended, time.monotonic() - start, attempts, last)

    while True:
        if stop is not None and stop.is_set():
            return result(False, "stopped")
        if alive is not None:
            gone = alive()
            if gone:
                return result(False, gone)
        remaining = end - time.monotonic()
        if remaining <= 0:
            return result(False, "deadline")
        attempts += 1
        p = probe(max(0.1, min(probe_timeout_s, remaining)))
        last = p.detail
        if p.ok:
            return result(True, "healthy")
        now = time.monotonic()
        if now >= next_log:
            log.info("sglang-warmup sidecar: still waiting for %s (%d probes, last: %s; "
                     "%.0f s of %.0f s left)", what, attempts, last, max(0.0, end - now),
                     deadline_s)
            next_log = now + log_every_s
        remaining = end - now
        if remaining <= 0:
            return result(False, "deadline")
        pause = min(delay, remaining)
        delay = min(delay * 2, max_s)
        gone = _pause(pause, stop, alive)
        if gone:
            return result(False, gone)


#: how often a pause between probes asks ``alive`` (a child's exit status: cheap)
_WATCH_S = 0.1


def _pause(seconds: float, stop: threading.Event | None,
           alive: Callable[[], str | None] | None) -> str | None:
    """Wait ``seconds`` between probes; "stopped" when ``stop`` is set, or why the thing probed
    cannot come up once ``alive`` says so (a server that exits is reported at once, not at the
    next probe up to ``max_s`` later)."""
    wake = time.monotonic() + seconds
    while True:
        left = wake - time.monotonic()
        if left <= 0:
            return None
        step = min(left, _WATCH_S) if alive is not None else left
        if stop is not None:
            if stop.wait(step):
                return "stopped"
        else:
            time.sleep(step)
        if alive is not None:
            gone = alive()
            if gone:
                return gone


# --- the client ---------------------------------------------------------------------------------
class HttpClient:
    """Requests to one server.  ``timeout_s``: the default per call; ``retries`` and
    ``backoff_s``: for idempotent reads (``backoff_s`` doubling per retry); ``api_key``: sent as
    ``Authorization: Bearer``."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, retries: int = 3,
                 backoff_s: float = 0.5, api_key: str | None = None) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise TransportError(f"{url!r} is not an http(s) URL",
                                 hint="e.g. --url http://127.0.0.1:30000")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.api_key = api_key

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
                retry: bool = False) -> tuple[int, bytes]:
        """``(status, body)`` of one call; HTTP errors are returned, not raised.  Raises
        TransportError when nothing answered (after the retries when ``retry``)."""
        data = None if body is None else json.dumps(body).encode()
        headers = self.headers()
        attempts = self.retries + 1 if retry else 1
        last: Exception | None = None
        for attempt in range(attempts):
            req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                    return resp.status, read_body(resp, f"{method} {path}")
            except urllib.error.HTTPError as exc:
                payload = read_body(exc, f"{method} {path}")
                if retry and exc.code >= 500 and attempt + 1 < attempts:
                    last = exc
                else:
                    return exc.code, payload
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = exc
                if attempt + 1 >= attempts:
                    break
            time.sleep(self.backoff_s * (2 ** attempt))
        raise self._unreachable(method, path, last)

    def _unreachable(self, method: str, path: str, exc: Exception | None) -> TransportError:
        reason = getattr(exc, "reason", exc)
        return TransportError(f"{method} {self.url}{path} failed: {printable(str(reason))}",
                              hint="is the server up and reachable from here?")

    def probe(self, path: str, timeout: float) -> Probe:
        """``GET path`` within ``timeout`` seconds, once; never raises."""
        req = urllib.request.Request(self.url + path, headers=self.headers(), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read(MAX_RESPONSE_BYTES)  # bounded; only the status matters here
                return Probe(resp.status, f"HTTP {resp.status}")
        except urllib.error.HTTPError as exc:
            return Probe(exc.code, f"HTTP {exc.code}")
        except urllib.error.URLError as exc:
            return Probe(None, _reason(exc.reason, timeout))
        except (TimeoutError, socket.timeout):
            return Probe(None, f"no answer within {timeout:g} s")
        except (ConnectionError, OSError) as exc:
            return Probe(None, _reason(exc, timeout))

    def health(self, timeout: float = 30.0) -> bool:
        """True when ``/health_generate`` answers 200 (the server can generate)."""
        return self.probe("/health_generate", timeout).ok

    def hint(self, status: int, default: str = "see the server log") -> str:
        """What to do about a refusal: for 401/403 which setting carries the API key."""
        if status in (401, 403):
            if self.api_key:
                return ("the server refused the API key sent: check --api-key / WARMUP_API_KEY "
                        "against the server's --api-key")
            return ("the server wants an API key: pass --api-key KEY or set WARMUP_API_KEY "
                    "(the server's --api-key)")
        return default

    def json(self, status: int, payload: bytes, what: str) -> Any:
        """The JSON body of a 200 answer; TransportError otherwise."""
        if status != 200:
            raise TransportError(f"{what} answered HTTP {status}: {snippet(payload)}",
                                 hint=self.hint(status))
        try:
            return json.loads(payload)
        except ValueError:
            raise TransportError(f"{what} answered non-JSON: {snippet(payload)}",
                                 hint="is --url an SGLang server?") from None

    def server_info(self, timeout: float | None = None) -> dict[str, Any]:
        """The server's resolved settings (retried; ``timeout`` per try, default
        ``min(60 s, timeout_s)``)."""
        timeout = timeout if timeout is not None else min(60.0, self.timeout_s)
        status, payload = self.request("GET", "/server_info", retry=True, timeout=timeout)
        if status == 404:  # SGLang before /server_info
            status, payload = self.request("GET", "/get_server_info", retry=True, timeout=timeout)
        return self.json(status, payload, "/server_info")

    def generate(self, body: dict[str, Any], timeout: float | None = None) -> list[dict[str, Any]]:
        """``POST /generate`` (not streamed): one output dict per prompt.  Never retried (not
        idempotent); an error answer raises, whatever its status."""
        status, payload = self.request("POST", "/generate", body, timeout=timeout)
        if status != 200:
            raise TransportError(f"/generate answered HTTP {status}: {snippet(payload)}",
                                 hint=self.hint(status))
        out = self.json(status, payload, "/generate")
        outs = out if isinstance(out, list) else [out]
        for o in outs:
            if not isinstance(o, dict):
                raise TransportError(f"/generate answered something other than an output: "
                                     f"{snippet(payload)}", hint="is --url an SGLang server?")
            if "error" in o:  # HTTP 200 with an error body: a proxy in front of SGLang
                raise TransportError(f"/generate answered an error: {error_message(o['error'])}",
                                     hint="see the server log (and the proxy's, if one is in "
                                          "front of it)")
        return outs

    def stream(self, body: dict[str, Any], on_chunk: Callable[[dict[str, Any]], None], *,
               timeout: float | None = None) -> dict[str, Any]:
        """``POST /generate`` with ``stream: true``: calls ``on_chunk`` per SSE chunk, returns
        the last one.  An error SGLang reports inside the stream (after its 200) raises."""
        req = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                     headers=self.headers(), method="POST")
        last: dict[str, Any] = {}
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                while raw := resp.readline(MAX_STREAM_LINE_BYTES + 1):
                    if len(raw) > MAX_STREAM_LINE_BYTES:
                        raise TransportError(f"POST /generate (stream) answered a line longer "
                                             f"than {MAX_STREAM_LINE_BYTES:,} bytes",
                                             hint="is --url an SGLang server?")
                    chunk = sse_chunk(raw, "is --url an SGLang server?")
                    if chunk is not None:
                        last = chunk
                        on_chunk(last)
        except urllib.error.HTTPError as exc:
            answer = read_body(exc, "POST /generate")
            raise TransportError(f"/generate answered HTTP {exc.code}: {snippet(answer)}",
                                 hint=self.hint(exc.code)) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise self._unreachable("POST", "/generate", exc) from None
        return last

    def flush(self, timeout_s: float, slack_s: float = 30.0) -> str:
        """``POST /flush_cache?timeout=T``: SGLang waits up to ``timeout_s`` for idle, then
        answers; ``slack_s`` covers the network.  Returns the server's text."""
        status, payload = self.request("POST", f"/flush_cache?timeout={timeout_s:g}",
                                       timeout=timeout_s + slack_s)
        if status != 200:
            raise TransportError(f"/flush_cache answered HTTP {status}: {snippet(payload)}",
                                 hint=self.hint(status, "the server was not idle in time; see "
                                                        "its log"))
        return snippet(payload) or "flushed"

    def freeze_gc(self) -> None:
        """``POST /freeze_gc``: SGLang freezes the garbage collector of its tokenizer manager,
        schedulers and detokenizer (what is alive is never scanned again)."""
        status, payload = self.request("POST", "/freeze_gc")
        if status != 200:
            raise TransportError(f"/freeze_gc answered HTTP {status}: {snippet(payload)}",
                                 hint=self.hint(status, "this SGLang may have no /freeze_gc; "
                                                        "start the sidecar with --no-freeze-gc"))
