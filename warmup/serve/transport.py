"""How warm-up requests reach SGLang: in-process through the TokenizerManager (before the port
opens, during ``--warmups``), or over HTTP (a sidecar warming a server started by someone else).

Both transports take the driver's :class:`~warmup.plan.model.WarmupStep` and return one
:class:`Outcome` per request; they raise :class:`~warmup.errors.TransportError` when SGLang
refuses, aborts or does not answer in time.  Token ids are made here, deterministically, from
the step (see :class:`TokenMaker`).  :class:`Transport` is what the driver uses of any of them.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar

from warmup.errors import HttpAppError, TransportError
from warmup.plan.facts import ServerFacts
from warmup.plan.model import WarmupRequest, WarmupStep
from warmup.serve.asgi import AsgiApp
from warmup.serve.http import HttpClient, error_message
from warmup.serve.report import as_number

T = TypeVar("T")

logger = logging.getLogger("sglang_warmup.transport")


@dataclass(frozen=True)
class Outcome:
    """What came back for one request."""

    output_tokens: int
    finish_reason: str | None
    latency_s: float
    #: SGLang's own latency of the request (``meta_info.e2e_latency``: from the tokenizer manager
    #: receiving it to its last output), None where SGLang reports none; ``latency_s`` less this
    #: is what the HTTP layer and the client added
    server_s: float | None = None


# --- token ids ----------------------------------------------------------------------------------
class TokenMaker:
    """Deterministic random prompt tokens in a safe id range.

    Ids are drawn from ``[lo, hi)`` with ``lo`` above the usual special tokens and ``hi`` below
    the vocabulary size (and below 30,000, where most tokenizers keep ordinary text tokens), so
    no BOS/EOS or control token appears.  A ``prefix_key`` names one token stream: a request
    starts with the stream's first ``prefix_len`` tokens, so two requests of one key share the
    first ``min`` of their ``prefix_len`` exactly and the radix cache hits there (a prompt and
    a longer one that starts with its whole chunks, a base and its page-aligned extends); the
    rest is fresh per request.
    """

    def __init__(self, vocab_size: int, seed: str = "0") -> None:
        self.hi = max(min(vocab_size, 30000), 64)
        self.lo = min(1000, self.hi // 4)
        self.seed = seed
        self.salt = ""  # change it to make a second pass send different tokens (no cache hits)
        #: each stream's tokens so far (ids below 30,000: two bytes each) and the generator
        #: that extends it
        self._streams: dict[tuple[str, str], tuple[array.array, random.Random]] = {}

    def _rng(self, *parts: Any) -> random.Random:
        h = hashlib.sha256("|".join(map(str, (self.seed,) + parts)).encode()).digest()
        return random.Random(int.from_bytes(h[:8], "big"))

    def _stream(self, key: str, n: int) -> list[int]:
        """The first ``n`` tokens of stream ``key`` (under the current salt), whatever lengths
        were asked before."""
        skey = (key, self.salt)
        if skey not in self._streams:
            self._streams[skey] = (array.array("H"), self._rng("prefix", *skey))
        tokens, rng = self._streams[skey]
        tokens.extend(rng.randrange(self.lo, self.hi) for _ in range(n - len(tokens)))
        return tokens[:n].tolist()

    def ids(self, step: WarmupStep, pos: int, req: WarmupRequest, salt: str = "") -> list[int]:
        out: list[int] = []
        if req.prefix_key:
            out = self._stream(req.prefix_key, min(req.prefix_len, req.input_len))
        rng = self._rng("step", step.index, pos, salt, self.salt)
        out.extend(rng.randrange(self.lo, self.hi) for _ in range(req.input_len - len(out)))
        return out

    def feature_ids(self, what: str, count: int) -> list[int]:
        """``count`` distinct ids from the same safe range, the same for every request (for
        ``token_ids_logprob`` and ``stop_token_ids``)."""
        count = max(0, min(count, self.hi - self.lo))
        return sorted(self._rng("feature", what).sample(range(self.lo, self.hi), count))


# --- the contract -------------------------------------------------------------------------------
class Transport(Protocol):
    """What the driver (:mod:`warmup.serve.driver`) and the second pass
    (:mod:`warmup.coverage.second_pass`) use of a transport: the in-process and HTTP ones here,
    the sidecar's, and the tests' stand-ins all have it."""

    #: the token ids of every request; the driver appends to its ``salt`` for a step's repeat,
    #: the second pass for its whole replay (fresh ids: no radix-cache hit), then restores it
    tokens: TokenMaker

    async def send(self, step: WarmupStep) -> list[Outcome]:
        """Send every request of ``step``; one outcome per request.  Raises
        :class:`~warmup.errors.TransportError` when SGLang refuses, aborts or does not answer
        in time (a stand-in may raise anything: the driver reports it with the step)."""
        ...

    async def flush(self, timeout_s: float) -> str:
        """Flush the server's radix cache within ``timeout_s`` seconds; one line saying what
        was flushed (``flushed on 2 rank(s)``)."""
        ...


def sampling_params(req: WarmupRequest, tokens: TokenMaker | None = None) -> dict[str, Any]:
    """SGLang sampling params for one warm-up request: the variant's, the length, and the
    request features that live there (``n``; ``stop_token_ids`` when ``tokens`` picks them)."""
    params = dict(req.sampling)
    params["max_new_tokens"] = req.max_new_tokens
    if req.ignore_eos:
        params["ignore_eos"] = True
    features = dict(req.features)
    if features.get("n", 1) > 1:
        params["n"] = features["n"]
    if features.get("stop_token_ids") and tokens is not None:
        params["stop_token_ids"] = tokens.feature_ids("stop", features["stop_token_ids"])
    return params


def generate_fields(req: WarmupRequest, input_ids: Any, tokens: TokenMaker, *,
                    params: Any = None, stream: bool | None = None) -> dict[str, Any]:
    """The ``/generate`` body (``GenerateReqInput`` fields) of one request: its ids, sampling
    params and request features (logprobs from a position, top-k, token ids, streaming).  For a
    batch, ``params`` holds every prompt's sampling params; the class's features are the same
    for every prompt.  ``stream`` overrides the request's own choice (mixed-step decoders)."""
    features = dict(req.features)
    fields: dict[str, Any] = {"input_ids": input_ids,
                              "sampling_params": params if params is not None
                              else sampling_params(req, tokens)}
    if features.get("return_logprob"):
        fields["return_logprob"] = True
        for key in ("logprob_start_len", "top_logprobs_num"):
            if key in features:
                fields[key] = features[key]
        if features.get("token_ids_logprob"):
            fields["token_ids_logprob"] = tokens.feature_ids("logprob",
                                                             features["token_ids_logprob"])
    fields["stream"] = bool(features.get("stream")) if stream is None else stream
    return fields


# --- in-process ---------------------------------------------------------------------------------
class InProcessTransport:
    """Requests through SGLang's own TokenizerManager, inside the server process.

    Single and concurrent requests are separate ``GenerateReqInput`` objects (concurrent ones
    issued from one event-loop tick with ``asyncio.gather``); a batch is one
    ``GenerateReqInput`` whose ``input_ids`` is a list of lists, which SGLang sends as one
    batched extend.  Aborts are detected from ``meta_info.finish_reason``.  With ``http`` (SGLang's
    own app, :mod:`warmup.serve.asgi`), a streamed single or concurrent request goes through it
    instead, so that the HTTP event-stream path is warm too; where the app does not start an
    answer (:class:`~warmup.errors.HttpAppError`), that request and every later one go to the
    tokenizer manager, with one warning.
    """

    def __init__(self, tokenizer_manager: Any, *, timeout_s: float = 600.0, seed: str = "0",
                 vocab_size: int | None = None, http: AsgiApp | None = None) -> None:
        self.tm = tokenizer_manager
        self.http = http
        self.timeout_s = timeout_s
        model_vocab = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", None)
        vocab = vocab_size or (model_vocab if model_vocab is not None else 32000)
        self.tokens = TokenMaker(int(vocab), seed)

    async def facts(self) -> ServerFacts:
        from warmup.plan import facts

        return await facts.from_tokenizer_manager(self.tm)

    def _request(self, fields: dict[str, Any]) -> Any:
        from sglang.srt.managers.io_struct import GenerateReqInput

        return GenerateReqInput(**fields)

    async def _drain(self, obj: Any) -> list[dict[str, Any]]:
        """Run one GenerateReqInput to completion; return its output dict(s)."""
        last: Any = None
        async for out in self.tm.generate_request(obj, None):
            last = out
        if last is None:
            raise TransportError("SGLang returned no output", hint="see the server log")
        return last if isinstance(last, list) else [last]

    async def send(self, step: WarmupStep) -> list[Outcome]:
        return await asyncio.wait_for(self._send(step), timeout=self.timeout_s)

    async def _send(self, step: WarmupStep) -> list[Outcome]:
        t0 = time.perf_counter()
        if step.mode == "batch":
            ids = [self.tokens.ids(step, i, r) for i, r in enumerate(step.requests)]
            params = [sampling_params(r, self.tokens) for r in step.requests]
            outs = await self._drain(self._request(
                generate_fields(step.requests[0], ids, self.tokens, params=params)))
            return [_outcome(o, time.perf_counter() - t0) for o in outs]
        if step.mode == "mixed":
            return await self._send_mixed(step, t0)
        bodies = [generate_fields(r, self.tokens.ids(step, i, r), self.tokens)
                  for i, r in enumerate(step.requests)]
        tasks = [asyncio.ensure_future(self._one(b, t0)) for b in bodies]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            # When one request of the group fails, withdraw the others (SGLang aborts a
            # cancelled request) instead of leaving them running into the next step.
            for t in tasks:
                t.cancel()

    async def _one(self, fields: dict[str, Any], t0: float) -> Outcome:
        out = None
        if fields.get("stream") and self.http is not None:
            try:
                out = await self.http.stream("/generate", fields)
            except HttpAppError as exc:         # the app, not the request: never again this run
                if self.http is not None:
                    logger.warning("sglang-warmup: %s; the plan's streamed requests go to the "
                                   "tokenizer manager instead", exc.message)
                self.http = None
        if out is None:
            out = (await self._drain(self._request(fields)))[0]
        return _outcome(out, time.perf_counter() - t0)

    async def _send_mixed(self, step: WarmupStep, t0: float) -> list[Outcome]:
        # Start the decoders streaming; once each has produced a token it is in the running
        # batch, and the prompt that arrives now is scheduled as a MIXED forward.
        started = [asyncio.Event() for _ in step.background]
        finals: list[Any] = [None] * len(step.background)

        async def decoder(i: int, req: WarmupRequest) -> None:
            obj = self._request(generate_fields(req, self.tokens.ids(step, 1000 + i, req),
                                                self.tokens, stream=True))
            async for out in self.tm.generate_request(obj, None):
                finals[i] = out
                started[i].set()
            started[i].set()

        tasks = [asyncio.create_task(decoder(i, r)) for i, r in enumerate(step.background)]
        try:
            await _decoders_started(started, tasks)
            prompt = [await self._one(generate_fields(r, self.tokens.ids(step, 0, r), self.tokens), t0)
                      for r in step.requests]
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        bg = [_outcome(f or {}, time.perf_counter() - t0) for f in finals]
        return prompt + bg

    async def flush(self, timeout_s: float) -> str:
        """Flush the radix cache on every DP rank; raise unless every rank succeeded."""
        from sglang.srt.managers.io_struct import FlushCacheReqInput

        comm = getattr(self.tm, "flush_cache_communicator", None)
        if hasattr(self.tm, "auto_create_handle_loop"):
            self.tm.auto_create_handle_loop()
        if comm is not None:
            results = await comm(FlushCacheReqInput(timeout_s=timeout_s))
            results = results if isinstance(results, list) else [results]
        else:  # older SGLang: only the first rank's answer is visible
            results = [await self.tm.flush_cache(timeout_s=timeout_s)]
        bad = [(i, getattr(r, "message", "")) for i, r in enumerate(results) if not getattr(r, "success", False)]
        if bad:
            detail = "; ".join(f"rank {i}: {m or 'failed'}" for i, m in bad)
            raise TransportError(f"cache flush failed on {len(bad)} of {len(results)} rank(s): {detail}",
                                 hint="the warm-up left requests running; see the scheduler log")
        return f"flushed on {len(results)} rank(s)"

    async def freeze_gc(self) -> None:
        """SGLang's ``freeze_gc``: the schedulers (and the detokenizer) freeze their garbage
        collector, then the tokenizer manager freezes its own."""
        freeze = getattr(self.tm, "freeze_gc", None)
        if freeze is None:
            raise TransportError("this SGLang has no freeze_gc (TokenizerManager.freeze_gc)",
                                 hint="set WARMUP_FREEZE_GC=0 (serve --no-freeze-gc), or use an SGLang "
                                      "that has /freeze_gc")
        if hasattr(self.tm, "auto_create_handle_loop"):
            self.tm.auto_create_handle_loop()
        await freeze()

    async def close(self) -> None:
        return None


async def _decoders_started(started: Sequence[asyncio.Event], tasks: Sequence[asyncio.Future]) -> None:
    """Wait until every background decoder has produced a token (or finished); a decoder that
    fails first raises its error at once instead of leaving the prompt waiting for it."""
    all_started = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in started)))
    waiting: set[asyncio.Future] = {all_started, *tasks}
    try:
        while not all_started.done():
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not all_started and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
    finally:
        all_started.cancel()


def _outcome(out: Any, latency: float) -> Outcome:
    meta = (out or {}).get("meta_info", {}) if isinstance(out, dict) else {}
    finish = meta.get("finish_reason")
    ftype = finish.get("type") if isinstance(finish, dict) else finish
    if ftype == "abort":
        msg = finish.get("message") if isinstance(finish, dict) else ""
        raise TransportError(f"SGLang aborted the request: "
                             f"{error_message(msg) if msg else 'no reason given'}",
                             hint="see the server log; check the plan's sizes against the server's limits")
    n = meta.get("completion_tokens")
    if n is None:
        n = len(out.get("output_ids") or []) if isinstance(out, dict) else 0
    server_s = as_number(meta.get("e2e_latency")) or None    # (0: not a latency either)
    return Outcome(output_tokens=int(n), finish_reason=ftype, latency_s=latency, server_s=server_s)


# --- HTTP ---------------------------------------------------------------------------------------
#: The most requests of one step the HTTP transport has in flight at once; a wider concurrent
#: or mixed step is sent in waves of this many (each in flight uses a thread and a socket).
MAX_IN_FLIGHT = 1024


class HttpTransport:
    """Requests over SGLang's HTTP API (``/health_generate``, ``/server_info``, ``/generate``,
    ``/flush_cache``) through one :class:`~warmup.serve.http.HttpClient`.

    Blocking standard-library HTTP, one daemon thread per request: every request of a concurrent
    or mixed step is in flight at once (up to ``max_in_flight``), as SGLang would see them from
    separate clients; a request that hangs past its timeout never holds up the process's exit.
    ``info_timeout_s``: per try of ``/server_info`` (default ``min(60 s, timeout_s)``);
    ``flush_slack_s``: added to the flush's own timeout for the network.
    """

    def __init__(self, url: str, *, timeout_s: float = 600.0, retries: int = 3,
                 backoff_s: float = 0.5, seed: str = "0", api_key: str | None = None,
                 vocab_size: int | None = None, info_timeout_s: float | None = None,
                 flush_slack_s: float = 30.0, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.client = HttpClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                 api_key=api_key)
        self.url = self.client.url
        self.timeout_s = timeout_s
        self.info_timeout_s = info_timeout_s
        self.flush_slack_s = flush_slack_s
        self.max_in_flight = max(1, int(max_in_flight))
        self.tokens = TokenMaker(vocab_size or 32000, seed)

    # -- API
    def health(self, timeout: float = 30.0) -> bool:
        """True when ``/health_generate`` answers 200 (the server can generate)."""
        return self.client.health(timeout)

    def server_info(self) -> dict[str, Any]:
        return self.client.server_info(self.info_timeout_s)

    def facts_sync(self) -> ServerFacts:
        from warmup.plan import facts

        f = facts.from_server_info(self.server_info())
        salt = self.tokens.salt
        self.tokens = TokenMaker(f.vocab_size, self.tokens.seed)
        self.tokens.salt = salt
        return f

    async def facts(self) -> ServerFacts:
        return await _in_thread(self.facts_sync)

    def generate_sync(self, fields: dict[str, Any],
                      timeout: float | None = None) -> list[dict[str, Any]]:
        """One ``/generate`` call with these fields; a streamed one is read to its last chunk."""
        if fields.get("stream"):
            return [self.client.stream(fields, lambda _: None, timeout=timeout)]
        return self.client.generate(fields, timeout=timeout)

    async def send(self, step: WarmupStep) -> list[Outcome]:
        t0 = time.perf_counter()
        if step.mode == "batch":
            ids = [self.tokens.ids(step, i, r) for i, r in enumerate(step.requests)]
            params = [sampling_params(r, self.tokens) for r in step.requests]
            outs = await _in_thread(self.generate_sync, generate_fields(
                step.requests[0], ids, self.tokens, params=params))
            return [_outcome(o, time.perf_counter() - t0) for o in outs]
        if step.mode == "mixed":
            return await self._send_mixed(step, t0)
        slots = asyncio.Semaphore(self.max_in_flight)

        async def one(i: int, r: WarmupRequest) -> Outcome:
            async with slots:
                outs = await _in_thread(self.generate_sync, generate_fields(
                    r, self.tokens.ids(step, i, r), self.tokens))
            return _outcome(outs[0], time.perf_counter() - t0)

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(step.requests))))

    async def _send_mixed(self, step: WarmupStep, t0: float) -> list[Outcome]:
        started = [asyncio.Event() for _ in step.background]
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_in_flight)

        def stream(i: int, req: WarmupRequest) -> dict[str, Any]:
            body = generate_fields(req, self.tokens.ids(step, 1000 + i, req), self.tokens,
                                   stream=True)
            last = self.client.stream(body, lambda _: _call_soon(loop, started[i].set))
            _call_soon(loop, started[i].set)
            return last

        async def decoder(i: int, req: WarmupRequest) -> dict[str, Any]:
            async with slots:
                return await _in_thread(stream, i, req)

        tasks = [asyncio.ensure_future(decoder(i, r)) for i, r in enumerate(step.background)]
        try:
            await asyncio.wait_for(_decoders_started(started, tasks), self.timeout_s)
            prompt = []
            for r in step.requests:
                outs = await _in_thread(self.generate_sync, generate_fields(
                    r, self.tokens.ids(step, 0, r), self.tokens))
                prompt.append(_outcome(outs[0], time.perf_counter() - t0))
            finals = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        return prompt + [_outcome(f, time.perf_counter() - t0) for f in finals]

    async def flush(self, timeout_s: float) -> str:
        return await _in_thread(self.client.flush, timeout_s, self.flush_slack_s)

    async def freeze_gc(self) -> None:
        await _in_thread(self.client.freeze_gc)

    async def close(self) -> None:
        return None


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a daemon thread of its own (not the loop's default pool, which holds
    min(32, CPUs + 4) threads and would queue the rest of a wide step)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            _call_soon(loop, _settle, future, None, exc)
        else:
            _call_soon(loop, _settle, future, result, None)

    threading.Thread(target=work, name="sglang-warmup-http", daemon=True).start()
    return await future


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():  # the awaiting step was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """``loop.call_soon_threadsafe`` that ignores a loop already closed (a request that
    outlived its step)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


__all__: Sequence[str] = ("InProcessTransport", "HttpTransport", "Outcome", "TokenMaker", "Transport")
