"""warmup.serve.http: the one HTTP client (probes, retries, the /server_info fallback, error
bodies with HTTP 200, printable server text) and the wait for health, against small local
servers on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from _loopback import responding
from warmup.errors import TransportError
from cache_tools.errors import printable
from warmup.serve.http import HttpClient, Probe, snippet, wait_for_health


class Canned:
    """A local server answering every request from ``answers[path]``: ``(status, body)``,
    the last one repeated; records the paths asked."""

    def __init__(self, answers: dict[str, list[tuple[int, bytes]]]) -> None:
        self.answers = answers
        self.paths: list[str] = []
        self.server = responding(self._answer)
        self.url = self.server.url

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        self.paths.append(path)
        queue = self.answers.get(path) or [(404, b'{"detail":"Not Found"}')]
        status, body = queue.pop(0) if len(queue) > 1 else queue[0]
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def canned():
    servers = []

    def start(answers):
        s = Canned(answers)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def test_printable_escapes_control_characters_and_keeps_text():
    assert printable("ok\nnext\tcol\r") == "ok next col "
    assert printable("red\x1b[31m bell\x07 del\x7f c1\x9b") == \
        "red\\x1b[31m bell\\x07 del\\x7f c1\\x9b"
    assert printable("abc\u202edcba \u2028x") == "abc\\u202edcba \\u2028x"
    assert printable("déjà vu — 東京 ✓") == "déjà vu — 東京 ✓"
    assert snippet(b"  \x1b]0;title\x07 " + b"x" * 300) == "\\x1b]0;title\\x07 " + "x" * 183 + "…"
    assert snippet(b"\xff\xfe") == "\ufffd\ufffd"  # undecodable bytes are replaced, not echoed


def test_generate_with_http_200_and_an_error_body_is_an_error(canned):
    body = json.dumps({"error": {"message": "rate limited\x1b[2J by the proxy"}}).encode()
    srv = canned({"/generate": [(200, body)]})
    with pytest.raises(TransportError) as err:
        HttpClient(srv.url).generate({"input_ids": [1]})
    assert err.value.message == "/generate answered an error: rate limited\\x1b[2J by the proxy"
    assert err.value.hint == ("see the server log (and the proxy's, if one is in front of it)")
    batch = json.dumps([{"meta_info": {}}, {"error": "overloaded"}]).encode()
    srv.answers["/generate"] = [(200, batch)]
    with pytest.raises(TransportError) as err:
        HttpClient(srv.url).generate({"input_ids": [[1], [2]]})
    assert err.value.message == "/generate answered an error: overloaded"
    srv.answers["/generate"] = [(200, b'[1, 2]')]
    with pytest.raises(TransportError) as err:
        HttpClient(srv.url).generate({"input_ids": [1]})
    assert err.value.message == "/generate answered something other than an output: [1, 2]"


def test_error_statuses_quote_the_body_printably(canned):
    srv = canned({"/generate": [(502, b"bad gateway\x1b[0m\r\nfrom upstream")],
                  "/server_info": [(503, b"\x00\x01starting")]})
    with pytest.raises(TransportError) as err:
        HttpClient(srv.url).generate({"input_ids": [1]})
    assert err.value.message == "/generate answered HTTP 502: bad gateway\\x1b[0m  from upstream"
    with pytest.raises(TransportError) as err:
        HttpClient(srv.url, retries=1, backoff_s=0.01).server_info()
    assert err.value.message == "/server_info answered HTTP 503: \\x00\\x01starting"


def test_server_info_falls_back_once_and_probe_never_raises(canned):
    info = json.dumps({"chunked_prefill_size": 256}).encode()
    srv = canned({"/get_server_info": [(200, info)], "/health_generate": [(503, b"")]})
    client = HttpClient(srv.url, api_key="sk-x")
    assert client.server_info() == {"chunked_prefill_size": 256}
    assert srv.paths == ["/server_info", "/get_server_info"]
    assert client.probe("/health_generate", 1.0) == Probe(503, "HTTP 503")
    assert client.health(1.0) is False
    gone = HttpClient("http://127.0.0.1:9")  # discard port: nothing listens
    assert gone.probe("/health", 1.0) == Probe(None, "connection refused")


def test_wait_for_health_backs_off_and_never_passes_its_deadline():
    calls = []

    def probe(timeout):
        calls.append((time.monotonic(), timeout))
        return Probe(503, "HTTP 503")

    t0 = time.monotonic()
    hw = wait_for_health(probe, 1.0, initial_s=0.1, max_s=0.4, probe_timeout_s=5.0)
    elapsed = time.monotonic() - t0
    assert (hw.ok, hw.ended, hw.last) == (False, "deadline", "HTTP 503")
    assert 1.0 <= elapsed < 1.5
    gaps = [b[0] - a[0] for a, b in zip(calls, calls[1:])]
    # 0.1 s doubling, capped at 0.4 s (plus the probe's own few milliseconds)
    for gap, pause in zip(gaps, [0.1, 0.2, 0.4, 0.4]):
        assert pause <= gap < pause + 0.08, gaps
    assert all(t <= 1.0 for _, t in calls)  # no probe may outlive the deadline


def test_wait_for_health_ends_on_stop_and_on_a_dead_process():
    stop = threading.Event()
    stop.set()
    assert wait_for_health(lambda t: Probe(None, "x"), 10, stop=stop).ended == "stopped"
    hw = wait_for_health(lambda t: Probe(None, "x"), 10, alive=lambda: "exited with code 3")
    assert (hw.ended, hw.attempts) == ("exited with code 3", 0)
    assert wait_for_health(lambda t: Probe(200, "HTTP 200"), 10).ok


def test_a_process_that_exits_during_a_pause_is_reported_at_once():
    """The pause between probes asks ``alive`` every 0.1 s: a server that exits 0.3 s into a
    10 s pause ends the wait then, not at the next probe."""
    started = time.monotonic()
    hw = wait_for_health(lambda t: Probe(None, "connection refused"), 60, initial_s=10.0,
                         alive=lambda: "exited with code 3" if time.monotonic() - started > 0.3
                         else None)
    assert (hw.ended, hw.attempts) == ("exited with code 3", 1)
    assert 0.3 <= hw.waited_s < 0.6
