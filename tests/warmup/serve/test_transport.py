"""warmup.serve.transport: the requests SGLang 0.5.22 receives (real ``GenerateReqInput`` and
``SamplingParams``), the in-process transport against the TokenizerManager stand-in, and the HTTP
transport against a local server speaking SGLang's HTTP API on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
import time
import types
import urllib.parse
from collections import Counter
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from _loopback import LocalServer
from warmup.plan import facts as facts_mod
from warmup.plan import loader
from warmup.errors import TransportError
from warmup.plan.model import SAMPLING_VARIANTS, WarmupRequest, WarmupStep
from warmup.plan.expand import expand
from warmup.serve.transport import (HttpTransport, InProcessTransport, Outcome, TokenMaker,
                                    generate_fields, sampling_params)

pytestmark = pytest.mark.usefixtures("warmup_isolated")

VOCAB = 20000  # the tiny model's vocabulary (tests/warmup/conftest.py)


def req(n: int, *, mnt: int = 1, sampling: dict | None = None, prefix: tuple[str, int] | None = None,
        ignore_eos: bool = False) -> WarmupRequest:
    return WarmupRequest(input_len=n, max_new_tokens=mnt, sampling_name="test",
                         sampling_params=tuple(sorted((sampling or {}).items())),
                         prefix_key=prefix[0] if prefix else None, prefix_len=prefix[1] if prefix else 0,
                         ignore_eos=ignore_eos)


def step(mode: str, requests, *, index: int = 0, background=()) -> WarmupStep:
    return WarmupStep(index=index, phase="p", shape_class="c", kind="extend", mode=mode,
                      requests=tuple(requests), background=tuple(background), note="n")


# --- token ids ------------------------------------------------------------------------------------
def test_token_ids_are_deterministic_in_a_safe_range_and_share_prefixes():
    tm = TokenMaker(VOCAB, seed="s")
    st = step("single", [req(300)])
    a = tm.ids(st, 0, req(300, prefix=("doc", 200)))
    assert a == TokenMaker(VOCAB, seed="s").ids(st, 0, req(300, prefix=("doc", 200)))
    assert len(a) == 300 and all(1000 <= t < VOCAB for t in a)
    b = tm.ids(replace(st, index=1), 0, req(250, prefix=("doc", 200)))
    assert b[:200] == a[:200] and b[200:] != a[200:250]
    assert TokenMaker(VOCAB, seed="other").ids(st, 0, req(300)) != tm.ids(st, 0, req(300))
    tm.salt = "pass2"  # a second pass sends different tokens, prefixes included
    assert tm.ids(st, 0, req(300, prefix=("doc", 200)))[:200] != a[:200]
    # a small vocabulary keeps ids below it
    small = TokenMaker(500, seed="s").ids(st, 0, req(64))
    assert all(125 <= t < 500 for t in small)



def test_one_prefix_key_is_one_stream_whatever_the_lengths_asked():
    """Requests of one key share the first ``min`` of their ``prefix_len`` tokens, in any
    order: a base prompt of 300 tokens and its page-aligned extends on 256 (``long_context``),
    and a chain of prompts each starting with the previous one's whole chunks."""
    st = step("single", [req(10)])
    first, later = TokenMaker(VOCAB, seed="s"), TokenMaker(VOCAB, seed="s")
    base = first.ids(st, 0, req(300, prefix=("k", 300)))
    hit = first.ids(replace(st, index=1), 0, req(293, prefix=("k", 256)))
    assert hit[:256] == base[:256] and hit[256:] != base[256:293]
    # asked longest first, the stream is the same
    long_first = later.ids(replace(st, index=1), 0, req(9000, prefix=("k", 8192)))
    assert later.ids(st, 0, req(300, prefix=("k", 300))) == base
    assert long_first[:256] == base[:256] and long_first[:300] == base
    # a prompt shorter than its prefix is the stream's start
    assert first.ids(st, 0, req(100, prefix=("k", 300))) == base[:100]
    assert first.ids(st, 0, req(300, prefix=("other", 300)))[:50] != base[:50]

@pytest.mark.parametrize("model_vocab, hi", [(None, 30000), (500, 500)])
def test_the_vocabulary_comes_from_the_model_config_else_the_default(model_vocab, hi):
    """A model config whose ``vocab_size`` is None takes the default, as one without it does
    (``int(None)`` raised before)."""
    tm = types.SimpleNamespace(model_config=types.SimpleNamespace(vocab_size=model_vocab))
    assert InProcessTransport(tm).tokens.hi == hi
    assert InProcessTransport(types.SimpleNamespace()).tokens.hi == 30000


# --- the objects SGLang receives -----------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(SAMPLING_VARIANTS))
def test_every_sampling_variant_is_valid_for_sglang(variant):
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = sampling_params(req(10, mnt=5, sampling=SAMPLING_VARIANTS[variant], ignore_eos=True))
    assert params["max_new_tokens"] == 5 and params["ignore_eos"] is True
    sp = SamplingParams(**params)
    sp.normalize(None)
    sp.verify(VOCAB)
    assert not any(k.startswith("return_") or "logprob" in k for k in params)  # none asked for
    if variant == "greedy":
        assert sp.top_k == 1  # SGLang's greedy path


def test_a_single_request_normalized_by_sglang(fake_tokenizer_manager):
    t = InProcessTransport(fake_tokenizer_manager(), vocab_size=VOCAB)
    obj = t._request({"input_ids": [1001, 1002, 1003],
                      "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
    obj.normalize_batch_and_arguments()
    assert obj.is_single and obj.batch_size == 1
    assert isinstance(obj.rid, str) and obj.stream is False
    assert obj.return_logprob is False and obj.top_logprobs_num == 0
    assert obj.sampling_params == {"max_new_tokens": 1, "temperature": 0.0}


def test_a_batch_request_normalized_by_sglang(fake_tokenizer_manager):
    t = InProcessTransport(fake_tokenizer_manager(), vocab_size=VOCAB)
    params = [{"max_new_tokens": 1, "temperature": 0.0}, {"max_new_tokens": 1}, {"max_new_tokens": 2}]
    obj = t._request({"input_ids": [[1001] * 8, [1002] * 8, [1003] * 16], "sampling_params": params})
    obj.normalize_batch_and_arguments()
    assert not obj.is_single and obj.batch_size == 3
    assert len(obj.rid) == 3 and len(set(obj.rid)) == 3
    assert obj.sampling_params == params
    assert obj.return_logprob == [False] * 3
    items = [obj[i] for i in range(3)]
    assert [len(i.input_ids) for i in items] == [8, 8, 16]
    assert [i.sampling_params for i in items] == params


def test_the_shipped_eager_batches_are_one_batched_request_with_logprobs(fake_tokenizer_manager):
    """The plan's tiny eager batches (one GenerateReqInput each, so that the scheduler takes
    them as one batch) carry every request's penalties and the logprob features, as SGLang
    normalizes them."""
    import _facts_cache

    exp = expand(loader.load("plans/deepseek_v4_serving_shapes.yaml"), _facts_cache.pr44627())
    steps = [s for s in exp.steps if s.shape_class == "eager_batches"]
    t = InProcessTransport(fake_tokenizer_manager(), vocab_size=VOCAB)
    for step in steps:
        ids = [t.tokens.ids(step, i, r) for i, r in enumerate(step.requests)]
        params = [sampling_params(r, t.tokens) for r in step.requests]
        obj = t._request(generate_fields(step.requests[0], ids, t.tokens, params=params))
        obj.normalize_batch_and_arguments()
        n = len(step.requests)
        assert step.mode == "batch" and not obj.is_single and obj.batch_size == n
        assert obj.return_logprob == [True] * n and obj.logprob_start_len == [0] * n
        assert obj.top_logprobs_num == [20] * n
        assert all(p["repetition_penalty"] == 1.05 and p["temperature"] == 0.0
                   for p in obj.sampling_params)
        assert [len(obj[i].input_ids) for i in range(n)] == [r.input_len for r in step.requests]


def test_in_process_send_returns_one_outcome_per_request(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    t = InProcessTransport(tm, vocab_size=VOCAB)
    single = asyncio.run(t.send(step("single", [req(37, mnt=3)])))
    batch = asyncio.run(t.send(step("batch", [req(8), req(8), req(16)])))
    conc = asyncio.run(t.send(step("concurrent", [req(19), req(20)])))
    assert [o.output_tokens for o in single] == [3]
    assert [o.finish_reason for o in batch] == ["length"] * 3
    assert len(conc) == 2 and all(isinstance(o, Outcome) for o in conc)
    assert tm.loop_calls >= 4  # SGLang's handle loop is started by generate_request itself
    assert {o.server_s for o in single + batch + conc} == {0.002}  # SGLang's e2e_latency


@pytest.mark.parametrize("value", [None, "0.5", float("nan"), float("inf"), True, [1]])
def test_a_missing_or_malformed_server_latency_is_none(value):
    from warmup.serve.transport import _outcome

    meta = {"finish_reason": {"type": "stop"}, "completion_tokens": 2}
    if value is not None:
        meta["e2e_latency"] = value
    out = _outcome({"meta_info": meta}, 0.5)
    assert (out.output_tokens, out.latency_s, out.server_s) == (2, 0.5, None)
    assert _outcome({"meta_info": dict(meta, e2e_latency=0.25)}, 0.5).server_s == 0.25


def test_in_process_abort_is_a_transport_error(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    tm.faults[9] = "abort"
    t = InProcessTransport(tm, vocab_size=VOCAB)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("batch", [req(8), req(9)])))
    assert err.value.message == "SGLang aborted the request: injected abort of a 9-token prompt"
    assert err.value.hint == "see the server log; check the plan's sizes against the server's limits"


def test_a_prompt_at_the_context_length_is_refused_by_sglang_rules(fake_tokenizer_manager):
    t = InProcessTransport(fake_tokenizer_manager(), vocab_size=VOCAB)
    with pytest.raises(ValueError, match=r"^The input \(4096 tokens\) is longer than the model's context "
                                         r"length \(4096 tokens\)\.$"):
        asyncio.run(t.send(step("single", [req(4096)])))


def test_in_process_mixed_decoder_failure_fails_at_once(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    tm.faults[33] = "error"
    t = InProcessTransport(tm, timeout_s=30, vocab_size=VOCAB)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="^injected rejection of a 33-token prompt$"):
        asyncio.run(t.send(step("mixed", [req(300)], background=[req(32, mnt=4), req(33, mnt=4)])))
    assert time.perf_counter() - t0 < 5
    assert [len(i.input_ids) for i in tm.items] == [32, 33]  # the prompt was never sent
    assert tm.in_flight == 0


def test_in_process_mixed_decoder_abort_is_reported(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    tm.faults[33] = "abort"
    t = InProcessTransport(tm, vocab_size=VOCAB)
    with pytest.raises(TransportError, match="^SGLang aborted the request: injected abort of a 33-token prompt$"):
        asyncio.run(t.send(step("mixed", [req(300)], background=[req(32, mnt=4), req(33, mnt=4)])))


# --- flush -----------------------------------------------------------------------------------------
def test_flush_requires_every_dp_rank(fake_tokenizer_manager):
    tm = fake_tokenizer_manager(dp_ranks=2)
    t = InProcessTransport(tm, vocab_size=VOCAB)
    assert asyncio.run(t.flush(12.5)) == "flushed on 2 rank(s)"
    assert [r.timeout_s for r in tm.flush_requests] == [12.5]
    tm.flush_fail_ranks = {0, 1}
    with pytest.raises(TransportError) as err:
        asyncio.run(t.flush(1))
    assert err.value.message == ("cache flush failed on 2 of 2 rank(s): rank 0: Timed out waiting for idle "
                                 "state.; rank 1: Timed out waiting for idle state.")


def test_flush_falls_back_to_flush_cache_without_the_communicator():
    from sglang.srt.managers.io_struct import FlushCacheReqOutput

    class OlderTokenizerManager:
        model_config = None
        calls: list = []

        async def flush_cache(self, timeout_s=None):
            self.calls.append(timeout_s)
            return FlushCacheReqOutput(success=False, message="not idle")

    tm = OlderTokenizerManager()
    with pytest.raises(TransportError, match=r"^cache flush failed on 1 of 1 rank\(s\): rank 0: not idle$"):
        asyncio.run(InProcessTransport(tm).flush(3))
    assert tm.calls == [3]


# --- freeze_gc -------------------------------------------------------------------------------------
def test_in_process_freeze_gc_is_sglangs_own(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    asyncio.run(InProcessTransport(tm, vocab_size=VOCAB).freeze_gc())
    assert tm.gc_frozen_after == 0


def test_in_process_freeze_gc_without_it_in_sglang_is_one_error():
    class OlderTokenizerManager:
        model_config = None

    with pytest.raises(TransportError, match=r"^this SGLang has no freeze_gc") as err:
        asyncio.run(InProcessTransport(OlderTokenizerManager()).freeze_gc())
    assert "WARMUP_FREEZE_GC" in err.value.hint


def test_the_freeze_gc_both_transports_call_exists_in_sglang():
    """TokenizerManager.freeze_gc (a coroutine: the schedulers, the detokenizer, then itself) and
    the /freeze_gc route, in SGLang 0.5.22 and 0.5.23 as installed here (read as source: the
    tokenizer manager imports fastapi, which the CPU profile does not install)."""
    import importlib.util
    from pathlib import Path

    installed = Path(importlib.util.find_spec("sglang").origin).parent
    newer = Path(__file__).resolve().parents[3] / ".deps" / "sglang-0.5.23" / "sglang"
    for root in (installed, newer):
        route = (root / "srt" / "entrypoints" / "http_server.py").read_text()
        assert '@app.api_route("/freeze_gc", methods=["GET", "POST"])' in route, root
        manager = (root / "srt" / "managers" / "tokenizer_manager.py").read_text()
        assert "async def freeze_gc(self)" in manager, root


# --- HTTP: a local server speaking SGLang's API ---------------------------------------------------
class SGLangHttpStandIn:
    """``/health_generate``, ``/server_info`` (+ ``/get_server_info``), ``/generate`` (JSON and
    SSE) and ``/flush_cache`` as SGLang 0.5.22's http_server answers them, over the
    TokenizerManager stand-in (one event loop, like uvicorn's).  ``script[path]`` holds canned
    ``(status, body)`` answers given first; ``delay[path]`` seconds are slept before answering."""

    def __init__(self, tm: Any, server_args: Any) -> None:
        self.tm = tm
        self.server_args = server_args
        self.script: dict[str, list[tuple[int, bytes]]] = {}
        self.delay: dict[str, float] = {}
        self.hits: Counter = Counter()
        self.hit_times: dict[str, list[float]] = {}
        self.headers: list[dict[str, str]] = []
        self.queries: list[str] = []
        self.bodies: list[dict] = []
        #: the queues of the streams being answered: ended by close(), so that no handler (nor
        #: the client thread reading it) outlives the test, waiting for a pump that stopped
        self.streams: set[queue.Queue] = set()
        self.closed = False
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._loop_thread.start()
        handler = type("Handler", (_Handler,), {"app": self})
        self.server = LocalServer(handler, quiet=True)  # clients that timed out and left
        self.url = self.server.url

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self.closed = True              # a stream opened from now on ends at once
        self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(5)
        for chunks in list(self.streams):   # pumps the stopped loop will never finish
            chunks.put(None)
        if not self._loop_thread.is_alive():
            self.loop.close()

    def server_info(self) -> dict[str, Any]:
        """What ``GET /server_info`` returns: SGLang's own build_server_info over the resolved
        ServerArgs, plus the scheduler's handshake info, the internal states and the version."""
        import sglang
        from sglang.srt.utils.common import build_server_info
        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        scheduler_info = {"status": "ready", "max_total_num_tokens": self.tm.max_total_num_tokens,
                          "max_req_input_len": self.tm.max_req_input_len, "startup_time": 1.5}
        info = {**build_server_info(self.server_args, scheduler_info), "startup_time": 1.0,
                "internal_states": self.call(self.tm.get_internal_state()),
                "version": sglang.__version__, "frontend": "python"}
        return msgspec_to_builtins(info)


class _Handler(BaseHTTPRequestHandler):
    app: SGLangHttpStandIn

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _dispatch(self) -> None:
        app = self.app
        parsed = urllib.parse.urlparse(self.path)
        path = parsed.path
        app.hits[path] += 1
        app.hit_times.setdefault(path, []).append(time.monotonic())
        app.headers.append(dict(self.headers))
        app.queries.append(parsed.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if app.delay.get(path):
            time.sleep(app.delay[path])
        if app.script.get(path):
            status, body = app.script[path].pop(0)
            return self._send(status, body)
        if path == "/health_generate":
            return self._send(200, b"")
        if path in ("/server_info", "/get_server_info"):
            return self._send(200, json.dumps(app.server_info()).encode())
        if path == "/flush_cache":
            return self._flush(urllib.parse.parse_qs(parsed.query))
        if path == "/freeze_gc":  # SGLang answers an empty 200
            self.app.call(self.app.tm.freeze_gc())
            return self._send(200, b"")
        if path == "/generate":
            return self._generate(json.loads(raw))
        return self._send(404, b'{"detail":"Not Found"}')

    def _flush(self, query: dict) -> None:
        from sglang.srt.managers.io_struct import FlushCacheReqInput

        timeout = float(query.get("timeout", ["0"])[0])
        ret = self.app.call(self.app.tm.flush_cache_communicator(FlushCacheReqInput(timeout_s=timeout)))[0]
        if ret.success:
            body = (b"Cache flushed.\nPlease check backend logs for more details. (When there are running "
                    b"or waiting requests, the operation will not be performed.)\n")
            return self._send(200, body, "text/plain")
        return self._send(400, (ret.message or "Flush cache failed.\n").encode(), "text/plain")

    def _generate(self, body: dict) -> None:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
        from sglang.srt.managers.io_struct import GenerateReqInput

        self.app.bodies.append(json.loads(json.dumps(body)))  # SGLang pops "n" in place
        error = generate_contract_error(body)
        if error is not None:
            return self._send(400, json.dumps({"error": error}).encode())
        obj = GenerateReqInput(**body)
        tm = self.app.tm
        if not obj.stream:
            try:
                out = self.app.call(tm.generate_request(obj, None).__anext__())
            except ValueError as exc:
                return self._send(400, json.dumps({"error": {"message": str(exc)}}).encode())
            return self._send(200, json.dumps(out).encode())
        chunks: queue.Queue = queue.Queue()

        async def pump() -> None:
            try:
                async for out in tm.generate_request(obj, None):
                    chunks.put(out)
            except ValueError as exc:
                chunks.put({"error": {"message": str(exc), "type": "invalid_request_error", "code": 400,
                                      "retryable": False}})
            finally:
                chunks.put(None)

        self.app.streams.add(chunks)
        if self.app.closed:
            chunks.put(None)
        try:
            asyncio.run_coroutine_threadsafe(pump(), self.app.loop)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            while (out := chunks.get()) is not None:
                self.wfile.write(b"data: " + json.dumps(out).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            self.app.streams.discard(chunks)


@pytest.fixture
def sglang_http(fake_tokenizer_manager, sglang_server_args):
    server = SGLangHttpStandIn(fake_tokenizer_manager(), sglang_server_args)
    yield server
    server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_facts_from_a_realistic_server_info(sglang_http):
    t = HttpTransport(sglang_http.url)
    f = t.facts_sync()
    assert (f.source, f.sglang_version) == ("server_info", "0.5.22")
    assert (f.chunked_prefill_size, f.enable_mixed_chunk, f.page_size) == (256, True, 1)
    assert (f.max_req_input_len, f.max_total_tokens, f.max_running_requests) == (4095, 20000, 8)
    assert f.context_length == 4096  # --context-length is a resolved server arg
    assert f.decode_graph_bs == (1, 2, 4, 8)
    # /server_info has no vocabulary size: the default stands, and says so
    assert f.vocab_size == 32000 and any(a.startswith("vocab_size=32000") for a in f.assumed)
    assert sglang_http.hits["/server_info"] == 1


def test_http_facts_fall_back_to_get_server_info(sglang_http):
    sglang_http.script["/server_info"] = [(404, b'{"detail":"Not Found"}')]
    f = HttpTransport(sglang_http.url).facts_sync()
    assert f.chunked_prefill_size == 256
    assert (sglang_http.hits["/server_info"], sglang_http.hits["/get_server_info"]) == (1, 1)


def test_http_facts_keep_the_token_salt(sglang_http):
    t = HttpTransport(sglang_http.url, seed="e2e")
    t.tokens.salt = "pass2"
    t.facts_sync()
    assert (t.tokens.seed, t.tokens.salt) == ("e2e", "pass2")


def test_http_single_concurrent_and_batch(sglang_http):
    sglang_http.tm.latency_s = 0.2  # long enough for the four requests to overlap on a busy machine
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, api_key="sk-test")
    assert [o.output_tokens for o in asyncio.run(t.send(step("single", [req(37, mnt=2)])))] == [2]
    conc = asyncio.run(t.send(step("concurrent", [req(19), req(32), req(45), req(58)])))
    assert len(conc) == 4 and sglang_http.tm.max_in_flight == 4
    batch = asyncio.run(t.send(step("batch", [req(8), req(8), req(16)])))
    assert len(batch) == 3
    objs = sglang_http.tm.objs
    assert [o.is_single for o in objs] == [True] * 5 + [False]
    assert objs[-1].batch_size == 3 and [len(x) for x in objs[-1].input_ids] == [8, 8, 16]
    assert all(i.return_logprob is False for i in sglang_http.tm.items)
    assert {h.get("Authorization") for h in sglang_http.headers} == {"Bearer sk-test"}


def test_http_mixed_streams_the_decoders_before_the_prompt(sglang_http):
    tm = sglang_http.tm
    tm.latency_s = 0.02
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, api_key="sk-test")
    outs = asyncio.run(t.send(step("mixed", [req(300)], background=[req(32, mnt=8, ignore_eos=True)] * 2)))
    assert [o.output_tokens for o in outs] == [1, 8, 8]
    decoders = [i for i in tm.items if i.stream]
    prompt = next(i for i in tm.items if not i.stream)
    assert len(decoders) == 2 and all(d.sampling.ignore_eos for d in decoders)
    order = [(kind, rids[0]) for kind, rids in tm.events]
    p = order.index(("start", prompt.rid))
    for d in decoders:
        assert order.index(("token", d.rid)) < p < order.index(("end", d.rid))
    assert {h.get("Authorization") for h in sglang_http.headers} == {"Bearer sk-test"}


def test_http_mixed_stream_error_is_reported_at_once(sglang_http):
    sglang_http.tm.faults[33] = "error"
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, timeout_s=30)
    t0 = time.perf_counter()
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("mixed", [req(300)], background=[req(32, mnt=4), req(33, mnt=4)])))
    assert err.value.message == "/generate (stream) answered an error: injected rejection of a 33-token prompt"
    assert time.perf_counter() - t0 < 5


def test_http_mixed_stream_http_error_carries_the_body(sglang_http):
    sglang_http.script["/generate"] = [(400, b'{"error": "bad request body"}')]
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, timeout_s=30)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("mixed", [req(300)], background=[req(32, mnt=4)])))
    assert err.value.message == '/generate answered HTTP 400: {"error": "bad request body"}'


def test_http_stream_chunk_that_is_not_json_names_the_url(sglang_http):
    sglang_http.script["/generate"] = [(200, b"data: {oops\n\ndata: [DONE]\n\n")]
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, timeout_s=30)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("mixed", [req(300)], background=[req(32, mnt=4)])))
    assert (err.value.message, err.value.hint) == ("/generate (stream) answered a chunk that is not JSON",
                                                   "is --url an SGLang server?")


def test_http_400_from_sglang_carries_its_message(sglang_http):
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB)
    bad = step("single", [req(10, sampling={"bogus": 1})])
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(bad))
    assert err.value.message.startswith('/generate answered HTTP 400: {"error": "unknown field `bogus`, '
                                        'expected one of `max_new_tokens`')
    assert err.value.message.endswith("…") and err.value.hint == "see the server log"
    too_long = step("single", [req(4096)])
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(too_long))
    assert err.value.message == ('/generate answered HTTP 400: {"error": {"message": "The input (4096 tokens) '
                                 'is longer than the model\'s context length (4096 tokens)."}}')
    assert sglang_http.hits["/generate"] == 2  # a refused generate is not retried


def test_http_500_on_generate_is_reported_with_the_body(sglang_http):
    sglang_http.script["/generate"] = [(500, b"Internal Server Error: scheduler died")]
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, retries=3, backoff_s=0.01)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("single", [req(10)])))
    assert err.value.message == "/generate answered HTTP 500: Internal Server Error: scheduler died"
    assert sglang_http.hits["/generate"] == 1


def test_http_abort_in_the_answer_is_a_transport_error(sglang_http):
    sglang_http.tm.faults[10] = "abort"
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB)
    with pytest.raises(TransportError, match="^SGLang aborted the request: injected abort of a 10-token prompt$"):
        asyncio.run(t.send(step("single", [req(10)])))


def test_http_server_info_retries_5xx_with_backoff(sglang_http):
    sglang_http.script["/server_info"] = [(503, b"starting"), (502, b"proxy")]
    t = HttpTransport(sglang_http.url, retries=3, backoff_s=0.1)
    assert t.server_info()["chunked_prefill_size"] == 256
    times = sglang_http.hit_times["/server_info"]
    assert len(times) == 3
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19  # 0.1 s, then 0.2 s


def test_http_server_info_retries_are_bounded(sglang_http):
    sglang_http.script["/server_info"] = [(503, b"still starting")] * 5
    t = HttpTransport(sglang_http.url, retries=2, backoff_s=0.01)
    with pytest.raises(TransportError) as err:
        t.server_info()
    assert err.value.message == "/server_info answered HTTP 503: still starting"
    assert sglang_http.hits["/server_info"] == 3


def test_http_server_info_non_json(sglang_http):
    sglang_http.script["/server_info"] = [(200, b"<html>hello</html>")]
    with pytest.raises(TransportError) as err:
        HttpTransport(sglang_http.url).server_info()
    assert (err.value.message, err.value.hint) == ("/server_info answered non-JSON: <html>hello</html>",
                                                   "is --url an SGLang server?")


def test_http_connection_refused_is_retried_then_reported():
    port = free_port()
    t = HttpTransport(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.05)
    t0 = time.perf_counter()
    with pytest.raises(TransportError) as err:
        t.server_info()
    elapsed = time.perf_counter() - t0
    assert err.value.message == f"GET http://127.0.0.1:{port}/server_info failed: [Errno 111] Connection refused"
    assert err.value.hint == "is the server up and reachable from here?"
    assert 0.05 + 0.1 <= elapsed < 5
    assert t.health(timeout=1) is False


def test_http_generate_timeout(sglang_http):
    sglang_http.delay["/generate"] = 1.0
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, timeout_s=0.2)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("single", [req(10)])))
    assert err.value.message == f"POST {sglang_http.url}/generate failed: timed out"


def test_http_server_info_timeout_follows_the_transport_timeout(sglang_http):
    sglang_http.delay["/server_info"] = 1.0
    t = HttpTransport(sglang_http.url, timeout_s=0.2, retries=1, backoff_s=0.01)
    t0 = time.perf_counter()
    with pytest.raises(TransportError) as err:
        t.server_info()
    assert err.value.message == f"GET {sglang_http.url}/server_info failed: timed out"
    assert time.perf_counter() - t0 < 3


def test_http_health(sglang_http):
    t = HttpTransport(sglang_http.url)
    assert t.health() is True
    sglang_http.script["/health_generate"] = [(503, b"")]
    assert t.health() is False


def test_http_flush(sglang_http):
    t = HttpTransport(sglang_http.url)
    assert asyncio.run(t.flush(60)) == ("Cache flushed. Please check backend logs for more details. (When there "
                                        "are running or waiting requests, the operation will not be performed.)")
    assert sglang_http.queries[-1] == "timeout=60"
    assert [r.timeout_s for r in sglang_http.tm.flush_requests] == [60.0]
    sglang_http.tm.flush_fail_ranks = {0}
    with pytest.raises(TransportError) as err:
        asyncio.run(t.flush(2.5))
    assert err.value.message == "/flush_cache answered HTTP 400: Timed out waiting for idle state."
    assert err.value.hint == "the server was not idle in time; see its log"
    assert sglang_http.queries[-1] == "timeout=2.5"


def test_http_freeze_gc(sglang_http):
    t = HttpTransport(sglang_http.url)
    asyncio.run(t.freeze_gc())
    assert sglang_http.hits["/freeze_gc"] == 1 and sglang_http.tm.gc_frozen_after == 0
    sglang_http.script["/freeze_gc"] = [(404, b'{"detail":"Not Found"}')]
    with pytest.raises(TransportError) as err:
        asyncio.run(t.freeze_gc())
    assert err.value.message == '/freeze_gc answered HTTP 404: {"detail":"Not Found"}'
    assert err.value.hint == "this SGLang may have no /freeze_gc; start the sidecar with --no-freeze-gc"


def test_http_url_must_be_http():
    with pytest.raises(TransportError) as err:
        HttpTransport("ftp://host:30000")
    assert (err.value.message, err.value.hint) == ("'ftp://host:30000' is not an http(s) URL",
                                                   "e.g. --url http://127.0.0.1:30000")


def test_a_whole_plan_over_http(sglang_http, tiny_plan_path):
    """The sidecar path: facts from /server_info, expansion, every step over HTTP, flush."""
    from warmup.serve.driver import Driver

    t = HttpTransport(sglang_http.url, vocab_size=VOCAB)
    facts = t.facts_sync()
    # /server_info cannot know the vocabulary or the generation config; give the tiny model's
    facts = replace(facts, vocab_size=VOCAB)
    t.tokens = TokenMaker(VOCAB, t.tokens.seed)
    exp = expand(loader.load(tiny_plan_path), facts)
    report = asyncio.run(Driver(t).run(exp))
    assert report.ok and report.requests == len(sglang_http.tm.items) == exp.num_requests
    assert report.transport == "HttpTransport" and report.flush.startswith("Cache flushed.")
    assert all(i.return_logprob is False for i in sglang_http.tm.items)
    assert facts_mod.from_server_info(sglang_http.server_info()).chunked_prefill_size == 256


# --- HTTP: concurrency -------------------------------------------------------------------------------
class InFlightServer:
    """A local ``/generate`` that holds every request until ``expected`` are in flight together
    (or ``hold_s`` passed), and records the most it ever had in flight."""

    def __init__(self, expected: int, hold_s: float = 5.0) -> None:
        self.expected = expected
        self.hold_s = hold_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrived = 0
        self.cond = threading.Condition()
        app = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = body["sampling_params"]["max_new_tokens"]
                with app.cond:
                    app.in_flight += 1
                    app.arrived += 1
                    app.max_in_flight = max(app.max_in_flight, app.in_flight)
                    app.cond.notify_all()
                if body.get("stream"):  # a decoder: its first token now, the rest after the hold
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(b"data: " + out(1, None) + b"\n\n")
                    self.wfile.flush()
                with app.cond:
                    app.cond.wait_for(lambda: app.arrived >= app.expected, app.hold_s)
                    app.in_flight -= 1
                if body.get("stream"):
                    self.wfile.write(b"data: " + out(n, "length") + b"\n\ndata: [DONE]\n\n")
                    self.close_connection = True
                    return
                data = out(n, "length")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def out(n: int, finish: str | None) -> bytes:
            return json.dumps({"output_ids": [7] * n, "meta_info": {
                "completion_tokens": n,
                "finish_reason": {"type": finish} if finish else None}}).encode()

        # the test measures the client, not this server's backlog
        self.server = LocalServer(Handler, backlog=256)
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


def test_http_a_64_request_concurrent_step_has_all_64_in_flight_at_once():
    server = InFlightServer(expected=64)
    try:
        t = HttpTransport(server.url, vocab_size=VOCAB, timeout_s=30)
        t0 = time.perf_counter()
        outs = asyncio.run(t.send(step("concurrent", [req(10 + i % 7, mnt=2) for i in range(64)])))
        took = time.perf_counter() - t0
    finally:
        server.close()
    assert [o.output_tokens for o in outs] == [2] * 64
    assert server.max_in_flight == 64
    assert took < server.hold_s  # nobody waited for the hold to run out


def test_http_in_flight_is_bounded_by_max_in_flight():
    server = InFlightServer(expected=10**6, hold_s=0.2)  # never all: each is held 0.2 s
    try:
        t = HttpTransport(server.url, vocab_size=VOCAB, timeout_s=30, max_in_flight=8)
        outs = asyncio.run(t.send(step("concurrent", [req(10) for _ in range(20)])))
    finally:
        server.close()
    assert len(outs) == 20 and server.max_in_flight == 8


def test_http_mixed_decoders_are_all_in_flight_with_the_prompt():
    # 40 streaming decoders and the prompt: 41 requests, far past the default thread pool
    server = InFlightServer(expected=41)
    try:
        t = HttpTransport(server.url, vocab_size=VOCAB, timeout_s=30)
        t0 = time.perf_counter()
        outs = asyncio.run(t.send(step("mixed", [req(50)], background=[req(10, mnt=3)] * 40)))
        took = time.perf_counter() - t0
    finally:
        server.close()
    assert [o.output_tokens for o in outs] == [1] + [3] * 40
    assert server.max_in_flight == 41 and took < server.hold_s


def test_http_generate_200_with_an_error_body_fails_the_step(sglang_http):
    sglang_http.script["/generate"] = [(200, b'{"error": {"message": "upstream busy\\u001b[1m"}}')]
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("single", [req(10)])))
    assert err.value.message == "/generate answered an error: upstream busy\\x1b[1m"


# --- request features: what SGLang receives ------------------------------------------------------
def _features_req(**features):
    from dataclasses import replace

    return replace(req(219, mnt=8, ignore_eos=True), features=tuple(sorted(features.items())))


def test_request_features_reach_sglangs_generate_req_input(fake_tokenizer_manager):
    """Logprobs from an offset with top-k and chosen ids, n parallel samples, stop ids and
    streaming: SGLang's own GenerateReqInput and SamplingParams accept what we build."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    t = InProcessTransport(fake_tokenizer_manager(), vocab_size=VOCAB)
    r = _features_req(return_logprob=True, logprob_start_len=100, top_logprobs_num=5,
                      token_ids_logprob=4, n=3, stop_token_ids=2, stream=True)
    fields = generate_fields(r, list(range(1000, 1219)), t.tokens)
    sp = dict(fields["sampling_params"])  # SGLang pops "n" when it normalizes
    obj = t._request(fields)
    obj.normalize_batch_and_arguments()
    # n > 1: SGLang expands the request into 3 parallel samples, each with the features
    assert obj.parallel_sample_num == 3 and obj.stream is True
    assert (obj.return_logprob, obj.logprob_start_len, obj.top_logprobs_num) == (
        [True] * 3, [100] * 3, [5] * 3)
    ids = obj.token_ids_logprob[0]
    assert len(ids) == 4 and all(t.tokens.lo <= i < t.tokens.hi for i in ids)
    assert sp["n"] == 3 and len(sp["stop_token_ids"]) == 2
    params = SamplingParams(**{k: v for k, v in sp.items() if k != "n"})
    params.normalize(None)
    params.verify(VOCAB)
    # the same ids every time (a repeat request takes the same path)
    assert generate_fields(r, [1], t.tokens)["token_ids_logprob"] == ids


def test_a_plain_request_carries_no_feature(fake_tokenizer_manager):
    t = InProcessTransport(fake_tokenizer_manager(), vocab_size=VOCAB)
    fields = generate_fields(req(10), [1001] * 10, t.tokens)
    assert fields == {"input_ids": [1001] * 10, "sampling_params": {"max_new_tokens": 1},
                      "stream": False}


def test_features_over_http_stream_and_logprobs(sglang_http):
    """Through SGLang's own /generate contract check and GenerateReqInput: a streamed request
    is read to its last chunk; the logprob fields and n are in the body."""
    srv = sglang_http
    ht = HttpTransport(srv.url, timeout_s=30, retries=0, vocab_size=VOCAB)
    step = WarmupStep(index=0, phase="p", shape_class="f", kind="extend", mode="single",
                      requests=(_features_req(return_logprob=True, logprob_start_len=0,
                                              stream=True),
                                _features_req(n=2, top_logprobs_num=3, return_logprob=True)))
    step = replace(step, mode="concurrent")
    outs = asyncio.run(ht.send(step))
    assert len(outs) == 2
    streamed, parallel = sorted(srv.bodies[-2:], key=lambda b: b["stream"], reverse=True)
    assert (streamed["stream"], streamed["return_logprob"], streamed["logprob_start_len"]) == (
        True, True, 0)
    assert parallel["sampling_params"]["n"] == 2 and parallel["top_logprobs_num"] == 3


@pytest.mark.parametrize("key, hint", [
    (None, "the server wants an API key: pass --api-key KEY or set WARMUP_API_KEY (the "
           "server's --api-key)"),
    ("sk-wrong", "the server refused the API key sent: check --api-key / WARMUP_API_KEY "
                 "against the server's --api-key"),
])
def test_a_401_says_which_setting_carries_the_key(sglang_http, key, hint):
    """SGLang started with --api-key answers 401 without (or with a wrong) Bearer token."""
    sglang_http.script["/server_info"] = [(401, b'{"error": "Unauthorized"}')]
    t = HttpTransport(sglang_http.url, vocab_size=VOCAB, api_key=key, retries=0)
    with pytest.raises(TransportError) as err:
        t.facts_sync()
    assert err.value.message == '/server_info answered HTTP 401: {"error": "Unauthorized"}'
    assert err.value.hint == hint
    sglang_http.script["/generate"] = [(403, b"forbidden")]
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("single", [req(10)])))
    assert err.value.hint == hint
