"""A local HTTP stand-in of SGLang's API for audit tests, whose "forward" really compiles Triton
kernels (on CPU, for sm_90) the way a server's first use of a shape does.

``Forward`` decides what a request compiles as SGLang's extend path does: one kernel
specialized on the token count it computes (Triton's integer classes 1 / divisible by 16 /
other) with ``next_power_of_2(batch size)`` and ``has_prefix`` as constexprs, and, for
non-greedy sampling, a sampler kernel per sampling family.  A page-granular radix cache (16
tokens a page, never covering a prompt's last token) decides what a prompt computes.  Each
specialization compiles once per process (Triton's in-memory cache), exactly as in a server.

``StandIn`` serves ``/health_generate``, ``/server_info``, ``/generate`` (single or batched
``input_ids``), ``/flush_cache`` and ``/metrics`` (the registry passed in, e.g. the one
``warmup.observe.events`` counts into).  ``fail_generate`` makes ``/generate`` answer HTTP 500.

Imported lazily by the tests, never at collection time.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import triton
import triton.language as tl
from triton.runtime.jit import MockTensor

PAGE = 16


@triton.jit
def standin_extend(x_ptr, y_ptr, n_tokens, BS: tl.constexpr, HAS_PREFIX: tl.constexpr):
    offs = tl.program_id(0) * 64 + tl.arange(0, 64)
    mask = offs < n_tokens
    v = tl.load(x_ptr + offs, mask=mask)
    if HAS_PREFIX:
        v = v * 2.0
    tl.store(y_ptr + offs, v * BS, mask=mask)


@triton.jit
def standin_sample(x_ptr, y_ptr, bs, FAMILY: tl.constexpr):
    offs = tl.arange(0, 64)
    mask = offs < bs
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + FAMILY, mask=mask)


FAMILIES = ("top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
            "presence_penalty")


def family(sampling: dict) -> int:
    """0 for greedy (argmax, no sampler kernel), else 1 + the first family key present."""
    if float(sampling.get("temperature", 1.0)) == 0.0:
        return 0
    for i, key in enumerate(FAMILIES):
        if key in sampling:
            return i + 1
    return len(FAMILIES) + 1


def clear_caches() -> None:
    """Forget every specialization (a fresh server process)."""
    standin_extend.device_caches.clear()
    standin_sample.device_caches.clear()


class Forward:
    """What one forward of a batch of prompts compiles (thread-safe: one at a time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cache: set[tuple[int, ...]] = set()

    def flush(self) -> None:
        with self.lock:
            self.cache.clear()

    def _hit(self, ids: list[int]) -> int:
        best = 0
        for k in range(1, len(ids) // PAGE + 1):
            if k * PAGE >= len(ids):  # never the last token
                break
            if tuple(ids[:k * PAGE]) in self.cache:
                best = k * PAGE
        for k in range(1, len(ids) // PAGE + 1):
            self.cache.add(tuple(ids[:k * PAGE]))
        return best

    def run(self, prompts: list[list[int]], sampling: list[dict]) -> list[int]:
        """Compute ``prompts`` as one batch; returns the cached tokens of each."""
        from warmup.observe.doctor import compile_only_target

        with self.lock, compile_only_target():
            hits = [self._hit(ids) for ids in prompts]
            computed = sum(len(ids) - h for ids, h in zip(prompts, hits))
            bs = len(prompts)
            standin_extend.warmup(MockTensor(tl.float32), MockTensor(tl.float32), computed,
                                  BS=1 << (bs - 1).bit_length(), HAS_PREFIX=int(any(hits)),
                                  grid=(1,))
            fam = max(family(s) for s in sampling)
            if fam:
                standin_sample.warmup(MockTensor(tl.float32), MockTensor(tl.float32), bs,
                                      FAMILY=fam, grid=(1,))
            return hits


SERVER_INFO = {
    "chunked_prefill_size": 2048, "page_size": PAGE, "context_length": 8192,
    "max_req_input_len": 8000, "max_total_num_tokens": 200000, "vocab_size": 32000,
    "max_running_requests": 16, "internal_states": [{"effective_max_running_requests_per_dp": 16}],
    "cuda_graph_config": {"decode": {"backend": "full", "bs": [1, 2, 4, 8], "max_bs": 8},
                          "prefill": {"backend": "disabled"}},
    "disable_radix_cache": False, "enable_mixed_chunk": False, "disaggregation_mode": "null",
    "tp_size": 1, "dp_size": 1, "version": "0.5.22",
}


class StandIn:
    """The HTTP stand-in; use as a context manager.  ``requests`` counts /generate calls."""

    def __init__(self, *, registry: Any = None, forward: Forward | None = None,
                 fail_generate: bool = False, healthy: bool = True, metrics: bool = True,
                 server_info: dict | None = None) -> None:
        self.forward = forward or Forward()
        self.registry = registry
        self.fail_generate = fail_generate
        self.healthy = healthy
        self.metrics = metrics
        self.info = dict(SERVER_INFO, **(server_info or {}))
        self.requests = 0
        self.flushes = 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else (
                    json.dumps(body).encode() if ctype == "application/json" else str(body).encode())
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = urllib.parse.urlparse(self.path).path
                if path == "/health_generate":
                    self.reply(200 if standin.healthy else 503, {})
                elif path == "/server_info":
                    self.reply(200, standin.info)
                elif path == "/metrics" and standin.metrics:
                    from prometheus_client import generate_latest

                    self.reply(200, generate_latest(standin.registry), "text/plain; version=0.0.4")
                else:
                    self.reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                path = urllib.parse.urlparse(self.path).path
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if path == "/flush_cache":
                    standin.forward.flush()
                    standin.flushes += 1
                    self.reply(200, "Cache flushed.\n", "text/plain")
                    return
                if path != "/generate":
                    self.reply(404, {"detail": "Not Found"})
                    return
                standin.requests += 1
                if standin.fail_generate:
                    self.reply(500, "Internal Server Error", "text/plain")
                    return
                ids = body["input_ids"]
                batched = bool(ids) and isinstance(ids[0], list)
                prompts = ids if batched else [ids]
                params = body.get("sampling_params") or {}
                sampling = params if isinstance(params, list) else [params] * len(prompts)
                hits = standin.forward.run(prompts, sampling)
                outs = [{"text": "", "output_ids": [7] * int(s.get("max_new_tokens", 1)),
                         "meta_info": {"finish_reason": {"type": "length"},
                                       "prompt_tokens": len(p), "cached_tokens": h,
                                       "completion_tokens": int(s.get("max_new_tokens", 1))}}
                        for p, s, h in zip(prompts, sampling, hits)]
                self.reply(200, outs if batched else outs[0])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "StandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- fixtures (imported by the test modules that use them) ------------------------------------
import pytest  # noqa: E402


class Recording:
    """A process recording compile events the way a server process with our hooks does."""

    def __init__(self, registry: Any, state_dir: Any) -> None:
        self.registry = registry
        self.state_dir = state_dir


@pytest.fixture
def recording(tmp_path, monkeypatch):
    """warmup.observe.events installed with a fresh registry and a state directory in the serving
    phase; Triton's hook slots, the phase and the stand-in kernels' caches restored after."""
    from prometheus_client import CollectorRegistry
    from triton import knobs

    from warmup.observe import events, phase

    for name in ("PROMETHEUS_MULTIPROC_DIR", "WARMUP_STATE_DIR", "WARMUP_SECOND_PASS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WARMUP_GC_PAUSE_MS", "0")   # a slow collection on a busy host: no record
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    saved = (knobs.compilation.listener, knobs.runtime.jit_cache_hook,
             knobs.runtime.jit_post_compile_hook,
             list(knobs.runtime.kernel_load_start_hook.calls),
             list(knobs.runtime.kernel_load_end_hook.calls))
    events.uninstall()
    phase.reset()
    clear_caches()
    registry = CollectorRegistry()
    state = tmp_path / "state"
    events.install(registry=registry, state_dir=state)
    phase.set_phase("serving", state_dir=state)
    yield Recording(registry, state)
    events.uninstall()
    phase.reset()
    clear_caches()
    knobs.compilation.listener, knobs.runtime.jit_cache_hook, \
        knobs.runtime.jit_post_compile_hook = saved[:3]
    knobs.runtime.kernel_load_start_hook.calls[:] = saved[3]
    knobs.runtime.kernel_load_end_hook.calls[:] = saved[4]


#: A small traffic sample whose compiles are known (see test_audit for the reasoning).
TRAFFIC = [
    {"kind": "single", "prompts": [100], "sampling": {"temperature": 0.0}, "label": "fresh"},
    {"kind": "single", "prompts": [37], "sampling": {"temperature": 0.0}, "label": "fresh"},
    {"kind": "burst", "prompts": [64, 80], "sampling": {"temperature": 0.7, "top_p": 0.95},
     "max_new_tokens": 4, "label": "burst"},
    {"kind": "batch", "prompts": [20, 30, 40], "sampling": {"temperature": 0.0}, "label": "batch_3"},
    {"kind": "single", "prompts": [60], "prefix": {"group": "doc", "len": 40},
     "sampling": {"temperature": 0.0}, "label": "rag"},
    {"kind": "single", "prompts": [70], "prefix": {"group": "doc", "len": 40},
     "sampling": {"temperature": 0.0}, "label": "rag"},
]


def write_traffic(path, steps=TRAFFIC):
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    return path
