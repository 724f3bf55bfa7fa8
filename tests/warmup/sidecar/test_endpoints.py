"""warmup.sidecar.endpoints: the sidecar's HTTP server under hostile clients (real sockets on
127.0.0.1): hundreds of idle connections, a request sent a byte at a time, oversized request
lines and headers, more connections than allowed, other protocols (a TLS hello, HTTP/0.9),
bare-LF lines; and the endpoints of a real Sidecar."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sidecar_support"))

from harness import PLAN, free_port, get  # noqa: E402

from warmup.sidecar.config import SidecarConfig  # noqa: E402
from warmup.sidecar.endpoints import Answer, EndpointServer  # noqa: E402
from warmup.sidecar.machine import Sidecar  # noqa: E402

#: Idle connections opened against the sidecar (the red team used 1,025; 300 keeps CI fast
#: while staying far above the old listen backlog of 5 and the thread-per-connection design).
IDLE_CONNECTIONS = 300
#: How long /ready may take to answer while they sit there (it takes milliseconds).
READY_BOUND_S = 1.0


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    for name in list(os.environ):
        if name.startswith("WARMUP_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name, raising=False)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything until the server closes the connection."""
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def timed_get(url: str) -> tuple[int | None, float]:
    t0 = time.monotonic()
    status, _ = get(url, timeout=READY_BOUND_S * 5)
    return status, time.monotonic() - t0


# --- a real sidecar ----------------------------------------------------------------------------------
@pytest.fixture
def sidecar():
    """A Sidecar whose server never comes up (its work loop keeps waiting), on a free port."""
    sc = Sidecar(SidecarConfig(plan=str(PLAN), url=f"http://127.0.0.1:{free_port()}", port=0,
                               deadline_s=600.0, backoff_initial_s=0.05, backoff_max_s=0.2))
    sc.start()
    yield sc
    sc.close(join_s=10)


def test_the_sidecar_listens_on_loopback_by_default(sidecar):
    assert SidecarConfig(plan="p", url="http://x:1").host == "127.0.0.1"
    assert sidecar._httpd.server_address[0] == "127.0.0.1"


def test_ready_and_live_answer_within_a_bound_while_hundreds_of_connections_sit_idle(sidecar):
    base = f"http://127.0.0.1:{sidecar.port}"
    threads_before = threading.active_count()
    idle = [connect(sidecar.port) for _ in range(IDLE_CONNECTIONS)]
    try:
        time.sleep(0.2)  # every one accepted and waiting for its request
        # no thread per connection: the pool is fixed
        assert threading.active_count() <= threads_before + 1
        for _ in range(10):
            for path, code in (("/ready", 503), ("/live", 200)):
                status, took = timed_get(base + path)
                assert status == code and took < READY_BOUND_S, (path, status, took)
        assert sidecar.state == "waiting"  # the sidecar itself is unaffected
    finally:
        for s in idle:
            s.close()


def test_idle_connections_are_closed_after_the_head_timeout(endpoint_server):
    """A connection that sends nothing gets 408 at the head timeout and is closed."""
    srv = endpoint_server(head_timeout_s=0.5)
    idle = [connect(srv.server_address[1]) for _ in range(20)]
    t0 = time.monotonic()
    try:
        assert all(read_all(s).startswith(b"HTTP/1.1 408 Request Timeout\r\n") for s in idle)
        assert time.monotonic() - t0 < 3.0
    finally:
        for s in idle:
            s.close()


def test_a_request_sent_a_byte_at_a_time_is_closed_at_the_head_timeout(endpoint_server):
    srv = endpoint_server(head_timeout_s=0.6)
    s = connect(srv.server_address[1])
    request = b"GET /ready HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100
    t0 = time.monotonic()
    closed_after = None
    try:
        for byte in request:
            try:
                s.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - t0
                break
            s.settimeout(0.05)
            try:
                data = s.recv(4096)
            except socket.timeout:
                continue
            except ConnectionResetError:
                data = b""
            # a request not complete in time: 408, never the answer to what it asked
            assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
            closed_after = time.monotonic() - t0
            break
    finally:
        s.close()
    assert closed_after is not None and 0.5 <= closed_after < 2.0, closed_after


def test_an_oversized_request_line_gets_400_and_is_closed(endpoint_server):
    srv = endpoint_server()
    s = connect(srv.server_address[1])
    s.sendall(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = read_all(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Connection: close\r\n" in answer
    assert answer.endswith(b'{\n "error": "request line too long"\n}\n')


def test_oversized_headers_get_431_and_are_closed(endpoint_server):
    srv = endpoint_server()
    s = connect(srv.server_address[1])
    s.sendall(b"GET /ready HTTP/1.1\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"b" * 100)
                                                    for i in range(90)) + b"\r\n")
    answer = read_all(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert answer.endswith(b'{\n "error": "request headers too large"\n}\n')


def test_headers_that_never_end_get_431_without_waiting_for_the_timeout(endpoint_server):
    srv = endpoint_server(head_timeout_s=30.0)
    s = connect(srv.server_address[1])
    t0 = time.monotonic()
    s.sendall(b"GET /ready HTTP/1.1\r\nX-Pad: " + b"c" * 9000)
    answer = read_all(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert time.monotonic() - t0 < 5.0


def test_past_the_connection_limit_the_oldest_idle_connection_is_dropped(endpoint_server):
    srv = endpoint_server(max_connections=8, head_timeout_s=30.0)
    port = srv.server_address[1]
    idle = [connect(port) for _ in range(20)]
    try:
        time.sleep(0.2)
        status, body = get(f"http://127.0.0.1:{port}/ready")
        assert (status, body) == (200, {"path": "/ready"})
        # the 12 oldest were dropped to make room; the newest still wait for their request
        assert all(read_all(s, timeout=2.0) == b"" for s in idle[:12])
        idle[-1].sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_all(idle[-1]).startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        for s in idle:
            s.close()


def test_methods_head_and_malformed_request_lines(endpoint_server):
    srv = endpoint_server()
    port = srv.server_address[1]

    def ask(raw: bytes) -> bytes:
        s = connect(port)
        s.sendall(raw)
        try:
            return read_all(s)
        finally:
            s.close()

    post = ask(b"POST /ready HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert post.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and b"Allow: GET, HEAD\r\n" in post
    head = ask(b"HEAD /ready/ HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 22\r\n" in head  # the GET body's length, no body
    assert ask(b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert ask(b"GET /ready?x=1 HTTP/1.1\r\n\r\n").endswith(b'{\n "path": "/ready"\n}\n')


def test_a_handler_error_is_a_500_and_the_server_goes_on():
    calls = []

    def handle(path: str) -> Answer:
        calls.append(path)
        if path == "/boom":
            raise RuntimeError("broken")
        return Answer.json(200, {"ok": True})

    srv = EndpointServer("127.0.0.1", 0, handle)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert get(base + "/boom") == (500, {"error": "RuntimeError: broken"})
        assert get(base + "/fine") == (200, {"ok": True})
        assert calls == ["/boom", "/fine"]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("raw, status", [
    (b"GET /ready\r\n", 400),                                    # HTTP/0.9: no version
    (b"GET /ready\n", 400),
    (bytes.fromhex("1603010200010001fc0303") + bytes(64), 400),    # a TLS ClientHello
    (b"\x00\x01\x02", 400),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),                  # HTTP/2 with prior knowledge
    (b"GET /ready HTTP/1.1\nHost: x\n\n", 200),                    # bare LF line ends
    (b"GET /ready HTTP/1.1\n\n", 200),
    (b"GET /ready HTTP/1.0\r\n\n", 200),
])
def test_other_protocols_and_bare_lf_are_answered_at_once(endpoint_server, raw, status):
    """What is no HTTP/1.x request is refused as soon as that shows (its first byte, or its
    request line), not at the head timeout; bare-LF requests are answered."""
    srv = endpoint_server(head_timeout_s=30.0)
    s = connect(srv.server_address[1])
    t0 = time.monotonic()
    s.sendall(raw)
    answer = read_all(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 %d " % status) and time.monotonic() - t0 < 2.0


def test_refused_clients_hold_no_worker(endpoint_server):
    """Clients refused at once that never read nor close (TLS hellos from a scanner, request
    lines too long) cost the reading thread a second of lingering each, not a worker: /ready
    answers at once."""
    srv = endpoint_server(workers=1, head_timeout_s=30.0)
    port = srv.server_address[1]
    hellos = [connect(port) for _ in range(20)]
    try:
        for i, h in enumerate(hellos):
            h.sendall(bytes.fromhex("160301020001") + bytes(64) if i % 2 else
                      b"GET /" + b"a" * 5000)
        time.sleep(0.1)
        status, took = timed_get(f"http://127.0.0.1:{port}/ready")
        assert status == 200 and took < READY_BOUND_S, took
    finally:
        for h in hellos:
            h.close()
