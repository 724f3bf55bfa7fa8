"""How warm-up requests reach SGLang: in-process through the TokenizerManager (before the port
opens, during ``--warmups``), or over HTTP (a sidecar warming a server started by someone else).

Both transports take the driver's :class:`~warmup.plan.model.WarmupStep` and return one
:class:`Outcome` per request; they raise :class:`~warmup.errors.TransportError` when SGLang
refuses, aborts or does not answer in time.  Token ids are made here, deterministically, from
the step (see :class:`TokenMaker`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence

from warmup.errors import TransportError
from warmup.plan.facts import ServerFacts
from warmup.plan.model import WarmupRequest, WarmupStep

logger = logging.getLogger("sglang_warmup.transport")


@dataclass(frozen=True)
class Outcome:
    """What came back for one request."""

    output_tokens: int
    finish_reason: str | None
    latency_s: float


# --- token ids ----------------------------------------------------------------------------------
class TokenMaker:
    """Deterministic random prompt tokens in a safe id range.

    Ids are drawn from ``[lo, hi)`` with ``lo`` above the usual special tokens and ``hi`` below
    the vocabulary size (and below 30,000, where most tokenizers keep ordinary text tokens), so
    no BOS/EOS or control token appears.  Requests sharing a ``prefix_key`` share their first
    ``prefix_len`` tokens exactly, so the radix cache hits; the rest is fresh per request.
    """

    def __init__(self, vocab_size: int, seed: str = "0") -> None:
        self.hi = max(min(vocab_size, 30000), 64)
        self.lo = min(1000, self.hi // 4)
        self.seed = seed
        self.salt = ""  # change it to make a second pass send different tokens (no cache hits)
        self._prefixes: dict[tuple[str, int, str], list[int]] = {}

    def _rng(self, *parts: Any) -> random.Random:
        h = hashlib.sha256("|".join(map(str, (self.seed,) + parts)).encode()).digest()
        return random.Random(int.from_bytes(h[:8], "big"))

    def ids(self, step: WarmupStep, pos: int, req: WarmupRequest, salt: str = "") -> list[int]:
        out: list[int] = []
        if req.prefix_key:
            key = (req.prefix_key, req.prefix_len, self.salt)
            if key not in self._prefixes:
                rng = self._rng("prefix", *key)
                self._prefixes[key] = [rng.randrange(self.lo, self.hi) for _ in range(req.prefix_len)]
            out = list(self._prefixes[key][: req.input_len])
        rng = self._rng("step", step.index, pos, salt, self.salt)
        out.extend(rng.randrange(self.lo, self.hi) for _ in range(req.input_len - len(out)))
        return out


def sampling_params(req: WarmupRequest) -> dict[str, Any]:
    """SGLang sampling params for one warm-up request (never logprobs)."""
    params = dict(req.sampling)
    params["max_new_tokens"] = req.max_new_tokens
    if req.ignore_eos:
        params["ignore_eos"] = True
    return params


# --- in-process ---------------------------------------------------------------------------------
class InProcessTransport:
    """Requests through SGLang's own TokenizerManager, inside the server process.

    Single and concurrent requests are separate ``GenerateReqInput`` objects (concurrent ones
    issued from one event-loop tick with ``asyncio.gather``); a batch is one
    ``GenerateReqInput`` whose ``input_ids`` is a list of lists, which SGLang sends as one
    batched extend.  Aborts are detected from ``meta_info.finish_reason``.
    """

    def __init__(self, tokenizer_manager: Any, *, timeout_s: float = 600.0, seed: str = "0",
                 vocab_size: int | None = None) -> None:
        self.tm = tokenizer_manager
        self.timeout_s = timeout_s
        vocab = vocab_size or getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", 32000)
        self.tokens = TokenMaker(int(vocab), seed)

    async def facts(self) -> ServerFacts:
        from warmup.plan import facts

        return await facts.from_tokenizer_manager(self.tm)

    def _request(self, input_ids: Any, params: Any, *, stream: bool = False) -> Any:
        from sglang.srt.managers.io_struct import GenerateReqInput

        return GenerateReqInput(input_ids=input_ids, sampling_params=params, stream=stream)

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
            params = [sampling_params(r) for r in step.requests]
            outs = await self._drain(self._request(ids, params))
            return [_outcome(o, time.perf_counter() - t0) for o in outs]
        if step.mode == "mixed":
            return await self._send_mixed(step, t0)
        objs = [self._request(self.tokens.ids(step, i, r), sampling_params(r))
                for i, r in enumerate(step.requests)]
        tasks = [asyncio.ensure_future(self._one(o, t0)) for o in objs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            # When one request of the group fails, withdraw the others (SGLang aborts a
            # cancelled request) instead of leaving them running into the next step.
            for t in tasks:
                t.cancel()

    async def _one(self, obj: Any, t0: float) -> Outcome:
        outs = await self._drain(obj)
        return _outcome(outs[0], time.perf_counter() - t0)

    async def _send_mixed(self, step: WarmupStep, t0: float) -> list[Outcome]:
        # Start the decoders streaming; once each has produced a token it is in the running
        # batch, and the prompt that arrives now is scheduled as a MIXED forward.
        started = [asyncio.Event() for _ in step.background]
        finals: list[Any] = [None] * len(step.background)

        async def decoder(i: int, req: WarmupRequest) -> None:
            obj = self._request(self.tokens.ids(step, 1000 + i, req), sampling_params(req), stream=True)
            async for out in self.tm.generate_request(obj, None):
                finals[i] = out
                started[i].set()
            started[i].set()

        tasks = [asyncio.create_task(decoder(i, r)) for i, r in enumerate(step.background)]
        try:
            await _decoders_started(started, tasks)
            prompt = [await self._one(self._request(self.tokens.ids(step, 0, r), sampling_params(r)), t0)
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
        raise TransportError(f"SGLang aborted the request: {msg or 'no reason given'}",
                             hint="see the server log; check the plan's sizes against the server's limits")
    n = meta.get("completion_tokens")
    if n is None:
        n = len(out.get("output_ids") or []) if isinstance(out, dict) else 0
    return Outcome(output_tokens=int(n), finish_reason=ftype, latency_s=latency)


# --- HTTP ---------------------------------------------------------------------------------------
class HttpTransport:
    """Requests over SGLang's HTTP API: ``/health_generate``, ``/server_info``, ``/generate``,
    ``/flush_cache``.  Blocking stdlib HTTP in worker threads (no extra dependency); every call
    has a timeout, and idempotent reads retry with backoff."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, retries: int = 3,
                 backoff_s: float = 0.5, seed: str = "0", api_key: str | None = None,
                 vocab_size: int | None = None) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise TransportError(f"{url!r} is not an http(s) URL",
                                 hint="e.g. --url http://127.0.0.1:30000")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.api_key = api_key
        self.tokens = TokenMaker(vocab_size or 32000, seed)

    # -- plumbing
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
              retry: bool = False) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers()
        attempts = self.retries + 1 if retry else 1
        last: Exception | None = None
        for attempt in range(attempts):
            req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                payload = exc.read()
                if retry and exc.code >= 500 and attempt + 1 < attempts:
                    last = exc
                else:
                    return exc.code, payload
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = exc
                if attempt + 1 >= attempts:
                    break
            time.sleep(self.backoff_s * (2 ** attempt))
        reason = getattr(last, "reason", last)
        raise TransportError(f"{method} {self.url}{path} failed: {reason}",
                             hint="is the server up and reachable from here?")

    def _json(self, status: int, payload: bytes, what: str) -> Any:
        if status != 200:
            raise TransportError(f"{what} answered HTTP {status}: {_snippet(payload)}",
                                 hint="see the server log")
        try:
            return json.loads(payload)
        except ValueError:
            raise TransportError(f"{what} answered non-JSON: {_snippet(payload)}",
                                 hint="is --url an SGLang server?") from None

    # -- API
    def health(self, timeout: float = 30.0) -> bool:
        """True when ``/health_generate`` answers 200 (the server can generate)."""
        try:
            status, _ = self._call("GET", "/health_generate", timeout=timeout)
        except TransportError:
            return False
        return status == 200

    def server_info(self) -> dict[str, Any]:
        timeout = min(60.0, self.timeout_s)
        status, payload = self._call("GET", "/server_info", retry=True, timeout=timeout)
        if status == 404:  # older servers
            status, payload = self._call("GET", "/get_server_info", retry=True, timeout=timeout)
        return self._json(status, payload, "/server_info")

    def facts_sync(self) -> ServerFacts:
        from warmup.plan import facts

        f = facts.from_server_info(self.server_info())
        salt = self.tokens.salt
        self.tokens = TokenMaker(f.vocab_size, self.tokens.seed)
        self.tokens.salt = salt
        return f

    async def facts(self) -> ServerFacts:
        return await asyncio.to_thread(self.facts_sync)

    def generate_sync(self, input_ids: Any, params: Any, timeout: float | None = None) -> list[dict[str, Any]]:
        status, payload = self._call("POST", "/generate",
                                     {"input_ids": input_ids, "sampling_params": params,
                                      "stream": False}, timeout=timeout)
        if status != 200:
            raise TransportError(f"/generate answered HTTP {status}: {_snippet(payload)}",
                                 hint="see the server log")
        out = self._json(status, payload, "/generate")
        return out if isinstance(out, list) else [out]

    async def send(self, step: WarmupStep) -> list[Outcome]:
        t0 = time.perf_counter()
        if step.mode == "batch":
            ids = [self.tokens.ids(step, i, r) for i, r in enumerate(step.requests)]
            params = [sampling_params(r) for r in step.requests]
            outs = await asyncio.to_thread(self.generate_sync, ids, params)
            return [_outcome(o, time.perf_counter() - t0) for o in outs]
        if step.mode == "mixed":
            return await self._send_mixed(step, t0)

        async def one(i: int, r: WarmupRequest) -> Outcome:
            outs = await asyncio.to_thread(self.generate_sync, self.tokens.ids(step, i, r), sampling_params(r))
            return _outcome(outs[0], time.perf_counter() - t0)

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(step.requests))))

    async def _send_mixed(self, step: WarmupStep, t0: float) -> list[Outcome]:
        started = [asyncio.Event() for _ in step.background]
        loop = asyncio.get_running_loop()

        def stream(i: int, req: WarmupRequest) -> dict[str, Any]:
            body = {"input_ids": self.tokens.ids(step, 1000 + i, req), "sampling_params": sampling_params(req),
                    "stream": True}
            r = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                       headers=self._headers(), method="POST")
            last: dict[str, Any] = {}
            try:
                with urllib.request.urlopen(r, timeout=self.timeout_s) as resp:
                    for raw in resp:
                        line = raw.decode(errors="replace").strip()
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        last = json.loads(line[5:])
                        if isinstance(last, dict) and "error" in last:
                            # SGLang reports a failure inside the stream, after a 200
                            raise TransportError(f"/generate (stream) answered an error: "
                                                 f"{_error_message(last['error'])}", hint="see the server log")
                        loop.call_soon_threadsafe(started[i].set)
            except urllib.error.HTTPError as exc:
                raise TransportError(f"/generate answered HTTP {exc.code}: {_snippet(exc.read())}",
                                     hint="see the server log") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                raise TransportError(f"POST {self.url}/generate failed: {getattr(exc, 'reason', exc)}",
                                     hint="is the server up and reachable from here?") from None
            loop.call_soon_threadsafe(started[i].set)
            return last

        tasks = [asyncio.ensure_future(asyncio.to_thread(stream, i, r)) for i, r in enumerate(step.background)]
        await asyncio.wait_for(_decoders_started(started, tasks), self.timeout_s)
        prompt = []
        for r in step.requests:
            outs = await asyncio.to_thread(self.generate_sync, self.tokens.ids(step, 0, r), sampling_params(r))
            prompt.append(_outcome(outs[0], time.perf_counter() - t0))
        finals = await asyncio.gather(*tasks)
        return prompt + [_outcome(f, time.perf_counter() - t0) for f in finals]

    async def flush(self, timeout_s: float) -> str:
        def call() -> tuple[int, bytes]:
            return self._call("POST", f"/flush_cache?timeout={timeout_s:g}", timeout=timeout_s + 30)

        status, payload = await asyncio.to_thread(call)
        if status != 200:
            raise TransportError(f"/flush_cache answered HTTP {status}: {_snippet(payload)}",
                                 hint="the server was not idle in time; see its log")
        return _snippet(payload) or "flushed"

    async def close(self) -> None:
        return None


def _error_message(error: Any) -> str:
    """The text of an SGLang ``{"error": ...}`` payload (a string or ``{"message": ...}``)."""
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(error)


def _snippet(payload: bytes, limit: int = 200) -> str:
    text = payload.decode(errors="replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


Transport = InProcessTransport | HttpTransport
__all__: Sequence[str] = ("InProcessTransport", "HttpTransport", "Outcome", "TokenMaker", "Transport")
