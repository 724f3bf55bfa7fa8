"""A local stand-in for SGLang's HTTP API, with fault injection, for the sidecar and prebake tests.

Serves what the sidecar and prebake use, with SGLang's status codes and body shapes:
``/health`` and ``/health_generate`` (503 while "starting"), ``/server_info`` (resolved server
settings), ``/generate`` (single, batched and streamed requests), ``/flush_cache`` (200, or 400
"Cache not flushed" as SGLang answers when it is not idle).  ``/_standin/stats`` reports what
was received.

With ``--compile``, every /generate runs a real Triton compile on CPU for sm_90 (one kernel
specialization per prompt-length class) with sglang-warmup's real compile-event hooks installed
(``warmup.observe.events.install``), exactly as the plugin does in SGLang's processes: records go to
``$WARMUP_STATE_DIR/compile_log`` stamped with the phase the sidecar writes, and counters to
``$PROMETHEUS_MULTIPROC_DIR``.  A second pass then finds every kernel in memory and compiles
nothing; ``--drift-after-flush`` makes the classes shift after the first flush, so a second
pass compiles new kernels (a plan that does not reproduce its shapes).

Faults: ``--never-healthy``, ``--healthy-after S``, ``--generate-status CODE --fail-at N``
(the Nth /generate answers CODE), ``--generate-error TEXT --fail-at N`` (the Nth /generate
answers HTTP 200 with an error body, as a proxy does), ``--flush-status CODE``, ``--hang PATH`` (an endpoint that
never answers), ``--die-at N`` (the process exits during the Nth /generate, dropping the
connection, as a crashed SGLang does).

Run: ``python standin.py --port 0`` prints ``PORT <n>`` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVER_INFO = {
    # the flat resolved server args SGLang's /server_info returns (the fields facts read)
    "model_path": "/models/stand-in",
    "chunked_prefill_size": 256,
    "page_size": 1,
    "context_length": 4096,
    "max_running_requests": 8,
    "max_prefill_tokens": 16384,
    "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 4, "bs": [1, 2, 4]},
                          "prefill": {"backend": "disabled", "bs": []}},
    "enable_mixed_chunk": False,
    "disable_radix_cache": False,
    "disaggregation_mode": "null",
    "speculative_algorithm": None,
    "tp_size": 1,
    "dp_size": 1,
    "tokenizer_worker_num": 1,
    "max_total_num_tokens": 65536,
    "max_req_input_len": 4090,
    "internal_states": [{"effective_max_running_requests_per_dp": 8}],
    "version": "0.5.22",
}


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.compile_lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.prompt_lens: list[int] = []
        self.flushes = 0
        self.compiled: list[int] = []

    def hit(self, name: str) -> int:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            return self.counts[name]

    def healthy(self) -> bool:
        a = self.args
        if a.never_healthy:
            return False
        return time.monotonic() - self.t0 >= a.healthy_after


def _block_for(n: int, drift: bool) -> int:
    block = 16 if n <= 16 else 64 if n <= 64 else 256
    return block * 2 if drift else block


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def st(self) -> State:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    # -- plumbing
    def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else None

    def _maybe_hang(self, path: str) -> None:
        if path in self.st.args.hang:
            time.sleep(self.st.args.hang_s)

    # -- routes
    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        self.st.hit(path)
        self._maybe_hang(path)
        if path in ("/health", "/health_generate"):
            self._send(200 if self.st.healthy() else 503, b"", "text/plain")
        elif path in ("/server_info", "/get_server_info"):
            self._send(200, SERVER_INFO)
        elif path == "/flush_cache":
            self._flush()
        elif path == "/_standin/stats":
            with self.st.lock:
                self._send(200, {"counts": dict(self.st.counts), "prompt_lens": self.st.prompt_lens,
                                 "flushes": self.st.flushes, "compiled": self.st.compiled,
                                 "pid": os.getpid()})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        n = self.st.hit(path)
        self._maybe_hang(path)
        if path == "/generate":
            self._generate(n)
        elif path == "/flush_cache":
            self._flush()
        elif path == "/freeze_gc":  # SGLang answers an empty 200
            code = self.st.args.freeze_status
            self._send(code, b"" if code == 200 else b"Internal Server Error", "text/plain")
        else:
            self._send(404, {"detail": "Not Found"})

    def _flush(self) -> None:
        a = self.st.args
        if a.flush_status != 200:
            msg = ("Cache not flushed. Please check for pending requests. (There are running or "
                   "waiting requests.)") if a.flush_status == 400 else "Internal Server Error"
            self._send(a.flush_status, msg, "text/plain")
            return
        with self.st.lock:
            self.st.flushes += 1
        self._send(200, "Cache flushed.\nPlease check backend logs for more details. "
                        "(When there are running or waiting requests, the operation will not "
                        "be performed.)\n", "text/plain")

    def _generate(self, n: int) -> None:
        a = self.st.args
        body = self._body() or {}
        if a.die_at and n >= a.die_at:
            os._exit(17)  # a crashed server: the connection drops without an answer
        if a.generate_error is not None and n >= a.fail_at:
            # a proxy in front of SGLang: HTTP 200 with an error body
            self._send(200, {"error": {"message": a.generate_error}})
            return
        if a.generate_status != 200 and n >= a.fail_at:
            self._send(a.generate_status, {"error": {"message": f"injected HTTP {a.generate_status}"
                                                                f" on /generate #{n}"}})
            return
        ids = body.get("input_ids") or []
        batch = bool(ids) and isinstance(ids[0], list)
        items = ids if batch else [ids]
        params = body.get("sampling_params") or {}
        plist = params if isinstance(params, list) else [params] * len(items)
        with self.st.lock:
            self.st.prompt_lens.extend(len(x) for x in items)
            drift = a.drift_after_flush and self.st.flushes > 0
        if a.compile:
            for x in items:
                self._compile(len(x), drift)
        outs = []
        for x, p in zip(items, plist):
            k = int((p or {}).get("max_new_tokens") or 1)
            outs.append({"text": "", "output_ids": [7] * k,
                         "meta_info": {"id": uuid.uuid4().hex, "prompt_tokens": len(x),
                                       "completion_tokens": k, "cached_tokens": 0,
                                       "finish_reason": {"type": "length", "length": k}}})
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(f"data: {json.dumps(outs[0])}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        self._send(200, outs if batch else outs[0])

    def _compile(self, n: int, drift: bool) -> None:
        import triton
        from triton.backends.compiler import GPUTarget

        block = _block_for(n, drift)
        with self.st.compile_lock:
            # One in-memory kernel cache per process, as in a real scheduler: a specialization
            # compiled (or loaded from disk) once is not compiled again.
            cache = self.server.kernels  # type: ignore[attr-defined]
            if block in cache:
                return
            src = triton.compiler.ASTSource(fn=_kernel(), signature={
                "x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}, constexprs={"BLOCK": block})
            cache[block] = triton.compile(src, target=GPUTarget("cuda", 90, 32))
            with self.st.lock:
                self.st.compiled.append(block)


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def standin_add(x, y, out, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask),
                     mask=mask)

        _KERNEL = standin_add
    return _KERNEL


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--never-healthy", action="store_true")
    ap.add_argument("--healthy-after", type=float, default=0.0)
    ap.add_argument("--generate-status", type=int, default=200)
    ap.add_argument("--fail-at", type=int, default=1)
    ap.add_argument("--generate-error", default=None,
                    help="the Nth /generate answers HTTP 200 with {\"error\": {\"message\": TEXT}}")
    ap.add_argument("--flush-status", type=int, default=200)
    ap.add_argument("--freeze-status", type=int, default=200)
    ap.add_argument("--hang", action="append", default=[], help="an endpoint path that never answers")
    ap.add_argument("--hang-s", type=float, default=3600.0)
    ap.add_argument("--die-at", type=int, default=0)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--drift-after-flush", action="store_true")
    return ap


def serve(args: argparse.Namespace, *, announce: bool = True) -> None:
    if args.compile:
        from warmup.observe import events

        report = events.install()  # the plugin's step, in this process
        if not report.installed:
            raise SystemExit(f"stand-in: compile hooks not installed: {report.to_json()}")
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    httpd.state = State(args)  # type: ignore[attr-defined]
    httpd.kernels = {}  # type: ignore[attr-defined]
    if announce:
        print(f"PORT {httpd.server_address[1]}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> None:
    serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
