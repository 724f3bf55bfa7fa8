"""Traffic samples: request shapes (no text) to replay against a ready server.

A traffic file is JSON lines; each line is one *step* sent at once:

``{"kind": "single"|"burst"|"batch", "prompts": [len, ...], "prefix": {"group": str, "len": n},
"max_new_tokens": n, "sampling": {...}, "features": {...}, "label": str}``

``burst`` sends the prompts as separate concurrent requests, ``batch`` as one request carrying a
list of prompts, ``single`` expects one prompt.  ``prefix`` makes every prompt of the step start
with the same ``len`` tokens as every other step of the same group (a shared system prompt, a
RAG document, an agent's growing context).  ``features`` are SGLang request fields every request
of the step carries (the plan format's names: ``return_logprob``, ``logprob_start_len``,
``top_logprobs_num``, ``token_ids_logprob`` and ``stop_token_ids`` (how many ids), ``n``,
``stream``).  :func:`synth` writes realistic samples.

Every input is bounded before it is used: files above :data:`MAX_FILE_BYTES` are refused before
they are read, a prompt is at most :data:`MAX_PROMPT_TOKENS` tokens, a step at most
:data:`MAX_PROMPTS` prompts, numbers are finite.  A refusal is one line naming the file, the
line and the field.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from warmup.errors import WarmupError
from warmup.plan.model import (MAX_FEATURE_IDS, MAX_PARALLEL_SAMPLES, REQUEST_BOOL_FEATURES,
                               REQUEST_INT_FEATURES, SAMPLING_KEYS, WarmupRequest, WarmupStep)

KINDS = ("chat", "rag", "agent", "batch", "features")
STEP_KINDS = ("single", "burst", "batch")

#: Limits on traffic files and request logs (checked before the data is used).
MAX_FILE_BYTES = 256 * 1024 * 1024   # a traffic file or request log
MAX_PROMPT_TOKENS = 10_000_000       # one prompt (well past any context length served today)
MAX_NEW_TOKENS = 1_000_000
MAX_PROMPTS = 4096                   # prompts of one step
MAX_STEPS = 200_000                  # steps of one file
_FIELDS = ("kind", "prompts", "max_new_tokens", "sampling", "prefix", "features", "label")


def _count(v: Any, limit: int, minimum: int = 1) -> bool:
    """An integer (not a bool) in [minimum, limit]."""
    return isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= limit


def _number(v: Any) -> bool:
    """A finite number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_features(d: Any, prompts: Iterable[int]) -> str | None:
    """None if ``d`` is a valid features mapping for these prompts, else what is wrong."""
    if not isinstance(d, dict):
        return "expected an object of request features"
    known = REQUEST_INT_FEATURES + REQUEST_BOOL_FEATURES
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        return f"unknown feature(s) {', '.join(unknown)} (known: {', '.join(known)})"
    for k, v in d.items():
        if k in REQUEST_BOOL_FEATURES:
            if not isinstance(v, bool):
                return f"{k}: expected true or false"
            continue
        limit = {"n": MAX_PARALLEL_SAMPLES, "logprob_start_len": MAX_PROMPT_TOKENS}.get(
            k, MAX_FEATURE_IDS)
        if not _count(v, limit, minimum=1 if k == "n" else 0):
            return f"{k}: expected an integer from {1 if k == 'n' else 0} to {limit:,}"
    start = d.get("logprob_start_len")
    if start is not None and any(start >= n for n in prompts):
        return f"logprob_start_len: {start} is not below every prompt's length"
    return None


@dataclass(frozen=True)
class TrafficStep:
    """One step of a traffic sample."""

    kind: str
    prompts: tuple[int, ...]
    max_new_tokens: int = 16
    sampling: dict[str, Any] = field(default_factory=dict)
    prefix_group: str | None = None
    prefix_len: int = 0
    label: str = ""
    features: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "prompts": list(self.prompts),
                             "max_new_tokens": self.max_new_tokens, "sampling": self.sampling}
        if self.prefix_group:
            d["prefix"] = {"group": self.prefix_group, "len": self.prefix_len}
        if self.features:
            d["features"] = dict(self.features)
        if self.label:
            d["label"] = self.label
        return d

    def to_step(self, index: int) -> WarmupStep:
        """As a driver step (so the same transports send it)."""
        params = tuple(sorted(self.sampling.items()))
        name = "greedy" if self.sampling.get("temperature") == 0 else "custom"
        reqs = tuple(WarmupRequest(input_len=n, max_new_tokens=self.max_new_tokens,
                                   sampling_name=name, sampling_params=params,
                                   prefix_key=self.prefix_group,
                                   prefix_len=min(self.prefix_len, n) if self.prefix_group else 0,
                                   ignore_eos=True, features=tuple(sorted(self.features.items())))
                     for n in self.prompts)
        mode = {"single": "single", "burst": "concurrent", "batch": "batch"}[self.kind]
        return WarmupStep(index=index, phase="traffic", shape_class=self.label or self.kind,
                          kind="traffic", mode=mode, requests=reqs,
                          note=f"{self.kind} {'+'.join(map(str, self.prompts))}")


def _read_lines(p: Path, what: str, *, errors: str = "strict") -> list[str]:
    """The lines of a file no larger than :data:`MAX_FILE_BYTES` (checked before reading)."""
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise WarmupError(f"{p}: cannot read {what}: {exc.strerror or exc}",
                          hint="check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise WarmupError(f"{p}: {what} is larger than {MAX_FILE_BYTES:,} bytes",
                          hint="split it, or sample part of it")
    try:
        return data.decode("utf-8", errors=errors).splitlines()
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise WarmupError(f"{p}:{line}: byte 0x{data[exc.start]:02x} is not UTF-8",
                          hint="traffic files are UTF-8 JSON lines") from None


def _json_line(line: str, where: str) -> Any:
    """One JSON value; NaN, Infinity and nesting deeper than the parser copes with are errors."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(line, parse_constant=constant)
    except RecursionError:
        raise WarmupError(f"{where}: not JSON: nested too deeply",
                          hint="one flat JSON object per line") from None
    except ValueError as exc:
        raise WarmupError(f"{where}: not JSON: {exc}", hint="one JSON object per line") from None


def load(path: str | Path) -> list[TrafficStep]:
    """Read a traffic file; errors name the line and the field."""
    p = Path(path)
    lines = _read_lines(p, "traffic file")
    steps = []
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if len(steps) >= MAX_STEPS:
            raise WarmupError(f"{p}:{i}: more than {MAX_STEPS:,} steps",
                              hint="sample part of the traffic")
        steps.append(_parse(_json_line(line, f"{p}:{i}"), f"{p}:{i}"))
    if not steps:
        raise WarmupError(f"{p}: no traffic steps", hint="`sglang-warmup traffic synth` writes a sample")
    return steps


def _parse(d: Any, where: str) -> TrafficStep:
    if not isinstance(d, dict):
        raise WarmupError(f"{where}: expected an object", hint="see `sglang-warmup traffic synth`")
    unknown = set(d) - set(_FIELDS)
    if unknown:
        raise WarmupError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}",
                          hint="fields: " + ", ".join(_FIELDS))
    kind = d.get("kind", "single")
    if not isinstance(kind, str) or kind not in STEP_KINDS:
        raise WarmupError(f"{where}: kind: {_shown(kind)} is not one of {', '.join(STEP_KINDS)}",
                          hint="single (one prompt), burst (concurrent requests) or batch (one request)")
    prompts = d.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in prompts):
        raise WarmupError(f"{where}: prompts: expected a non-empty list of positive integers",
                          hint="prompt lengths in tokens")
    if len(prompts) > MAX_PROMPTS or max(prompts) > MAX_PROMPT_TOKENS:
        raise WarmupError(f"{where}: prompts: at most {MAX_PROMPTS:,} prompts of at most "
                          f"{MAX_PROMPT_TOKENS:,} tokens each",
                          hint="prompt lengths in tokens; split a larger burst")
    if kind == "single" and len(prompts) != 1:
        raise WarmupError(f"{where}: prompts: a single step has one prompt", hint="use burst or batch")
    mnt = d.get("max_new_tokens", 16)
    if not _count(mnt, MAX_NEW_TOKENS):
        raise WarmupError(f"{where}: max_new_tokens: expected a positive integer",
                          hint="tokens to generate per prompt, e.g. 16")
    sampling = d.get("sampling") or {}
    if not isinstance(sampling, dict) or set(sampling) - SAMPLING_KEYS:
        raise WarmupError(f"{where}: sampling: keys must be among {', '.join(sorted(SAMPLING_KEYS))}",
                          hint='SGLang sampling parameters, e.g. {"temperature": 0.7}')
    bad = next((k for k, v in sampling.items() if not _number(v)), None)
    if bad is not None:
        raise WarmupError(f"{where}: sampling.{bad}: expected a finite number",
                          hint='SGLang sampling parameters, e.g. {"temperature": 0.7}')
    features = d.get("features") or {}
    problem = check_features(features, prompts)
    if problem:
        raise WarmupError(f"{where}: features: {problem}",
                          hint='e.g. "features": {"return_logprob": true, "top_logprobs_num": 5}')
    prefix = d.get("prefix")
    group, plen = None, 0
    if prefix is not None:
        if not isinstance(prefix, dict) or not isinstance(prefix.get("group"), str) or \
                not isinstance(prefix.get("len"), int) or isinstance(prefix["len"], bool) or prefix["len"] < 1:
            raise WarmupError(f"{where}: prefix: expected {{\"group\": str, \"len\": n}}",
                              hint='e.g. "prefix": {"group": "system", "len": 512}')
        group, plen = prefix["group"], prefix["len"]
        if any(n <= plen for n in prompts):
            raise WarmupError(f"{where}: prefix: every prompt must be longer than the prefix ({plen})",
                              hint="prompt lengths include the shared prefix")
    label = d.get("label", "")
    if not isinstance(label, str) or len(label) > 200 or not label.isprintable():
        raise WarmupError(f"{where}: label: expected printable text of at most 200 characters",
                          hint='e.g. "label": "chat_turn"')
    return TrafficStep(kind=kind, prompts=tuple(prompts), max_new_tokens=mnt, sampling=dict(sampling),
                       prefix_group=group, prefix_len=plen, label=label, features=dict(features))


def _shown(value: Any) -> str:
    """A value for an error line: short, printable, no control bytes."""
    text = repr(value)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 40 else text[:37] + "..."


def dump(steps: Iterable[TrafficStep]) -> str:
    """JSON lines; never writes NaN or Infinity (a step holding one was not validated)."""
    return "".join(json.dumps(s.to_json(), sort_keys=True, allow_nan=False) + "\n" for s in steps)


# --- synthesis ---------------------------------------------------------------------------------
_SAMPLINGS = [
    {"temperature": 0.0},
    {"temperature": 0.7, "top_p": 0.95},
    {"temperature": 0.6, "top_k": 20},
    {"temperature": 1.0, "min_p": 0.1},
    {"temperature": 0.8, "repetition_penalty": 1.05},
]


#: The smallest ``max_prompt`` synth accepts: a system prompt (<= 900) or an agent context
#: (>= 1200) plus a turn must fit.
MIN_SYNTH_PROMPT = 1600


def synth(kind: str, *, seed: int = 0, steps: int = 24, max_prompt: int = 12000,
          chunk: int = 8192) -> list[TrafficStep]:
    """A realistic traffic sample of ``kind`` (chat, rag, agent, batch, features).  Deterministic
    per seed.  ``features``: requests with every request feature (logprobs from 0 and from an
    offset, top-k, token ids, n > 1, streaming with stop ids), bursts of 20-64, long decodes,
    prompts at the chunk boundary (``chunk``: the server's chunked_prefill_size) and long
    shared prefixes."""
    if kind not in KINDS:
        raise WarmupError(f"unknown traffic kind {kind!r}", hint="one of: " + ", ".join(KINDS))
    if max_prompt < MIN_SYNTH_PROMPT:
        raise WarmupError(f"max_prompt {max_prompt} is below {MIN_SYNTH_PROMPT} tokens",
                          hint="a sample needs room for a system prompt or an agent context plus a turn")
    rng = random.Random(f"{kind}:{seed}")

    def length(lo: int, hi: int) -> int:
        # log-uniform: chat lengths are heavy-tailed
        import math

        return max(1, min(max_prompt, int(math.exp(rng.uniform(math.log(lo), math.log(hi))))))

    out: list[TrafficStep] = []
    system = length(300, 900)
    for i in range(steps):
        samp = dict(_SAMPLINGS[rng.randrange(len(_SAMPLINGS))])  # a copy per step
        if kind == "chat":
            r = rng.random()
            if r < 0.45:
                n = system + length(8, 600)
                out.append(TrafficStep("single", (n,), length(16, 128), samp, "system", system, "chat_turn"))
            elif r < 0.7:
                k = rng.randint(2, 8)
                out.append(TrafficStep("burst", tuple(system + length(8, 400) for _ in range(k)),
                                       length(16, 96), samp, "system", system, "chat_burst"))
            elif r < 0.9:
                out.append(TrafficStep("single", (length(1, 3000),), length(8, 64), samp, label="chat_fresh"))
            else:
                out.append(TrafficStep("single", (length(6000, max_prompt),), 8, samp, label="chat_long"))
        elif kind == "rag":
            doc = f"doc{rng.randrange(3)}"
            dlen = {"doc0": 2048, "doc1": 3500, "doc2": min(7000, max_prompt - 600)}[doc]
            dlen = min(dlen, max_prompt - 400)  # the query (<= 400 tokens) must fit too
            if rng.random() < 0.3:
                k = rng.randint(2, 5)
                out.append(TrafficStep("burst", tuple(dlen + length(20, 300) for _ in range(k)),
                                       length(32, 160), samp, doc, dlen, "rag_burst"))
            else:
                out.append(TrafficStep("single", (dlen + length(20, 400),), length(32, 200), samp, doc, dlen,
                                       "rag_query"))
        elif kind == "agent":
            # a growing context: each turn extends the previous one
            base = 1200 + 350 * i
            if base + 400 > max_prompt:
                base = 1200
            out.append(TrafficStep("single", (base + length(10, 300),), length(8, 64),
                                   {"temperature": 0.0} if i % 3 else samp, f"agent{base}", base, "agent_turn"))
            if i % 5 == 4:
                out.append(TrafficStep("burst", tuple(base + length(10, 200) for _ in range(3)),
                                       16, samp, f"agent{base}", base, "agent_tools"))
        elif kind == "features":
            out.append(_feature_step(i, rng, samp, length, max_prompt, chunk))
        else:  # batch
            bs = rng.randint(2, 24)
            out.append(TrafficStep("batch", tuple(length(50, 1500) for _ in range(bs)), length(8, 128),
                                   samp, label=f"batch_{bs}"))
    return out


def _feature_step(i: int, rng: random.Random, samp: dict[str, Any], length: Any,
                  max_prompt: int, chunk: int) -> TrafficStep:
    """Step ``i`` of a features sample: the families in turn, sizes drawn from ``rng``."""
    family = i % 8
    n = length(50, 3000)
    if family == 0:
        return TrafficStep("single", (n,), length(1, 8), samp, label="logprobs_from_0",
                           features={"return_logprob": True, "logprob_start_len": 0})
    if family == 1:
        return TrafficStep("single", (n,), length(1, 16), samp, label="logprobs_offset_top",
                           features={"return_logprob": True, "logprob_start_len": n // 2,
                                     "top_logprobs_num": rng.choice([1, 5, 20])})
    if family == 2:
        return TrafficStep("single", (n,), length(8, 32), samp, label="output_logprobs_ids",
                           features={"return_logprob": True, "top_logprobs_num": 5,
                                     "token_ids_logprob": rng.randint(1, 8)})
    if family == 3:
        return TrafficStep("single", (n,), length(8, 32), samp, label="parallel_n",
                           features={"n": rng.choice([2, 3, 4, 8])})
    if family == 4:
        k = rng.randint(20, 64)
        return TrafficStep("burst", tuple(length(20, 800) for _ in range(k)), length(8, 48),
                           samp, label=f"burst_{k}")
    if family == 5:
        return TrafficStep("single", (length(8, 400),), rng.randint(256, 1024), samp,
                           label="long_decode")
    if family == 6:
        m = min(max_prompt, max(2, chunk + rng.choice([-1, 0, 1, 37, chunk + 7])))
        return TrafficStep("single", (m,), 8, samp, label="chunk_boundary")
    plen = min(6000, max_prompt - 400)
    k = rng.randint(1, 3)
    features = {"stream": True, "stop_token_ids": 2} if rng.random() < 0.5 else {}
    return TrafficStep("burst" if k > 1 else "single",
                       tuple(plen + length(10, 300) for _ in range(k)), length(8, 32), samp,
                       "long_prefix", plen, "long_prefix", features)


# --- conversion from request logs --------------------------------------------------------------
CONVERT_FORMATS = ("openai", "sglang-log")
#: OpenAI request fields that become SGLang sampling parameters.
_OPENAI_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "frequency_penalty": "frequency_penalty",
                    "presence_penalty": "presence_penalty",
                    "repetition_penalty": "repetition_penalty", "seed": "sampling_seed"}
#: Fields that carry an exact prompt token count, looked up in this order.
_TOKEN_FIELDS = (("prompt_tokens",), ("input_tokens",), ("num_prompt_tokens",),
                 ("usage", "prompt_tokens"), ("response", "body", "usage", "prompt_tokens"))


@dataclass(frozen=True)
class Conversion:
    """Steps converted from a request log, what was left out (reason -> count), and notes."""

    steps: tuple[TrafficStep, ...]
    requests: int
    skipped: dict[str, int]
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        text = f"converted {self.requests} request(s) into {len(self.steps)} traffic step(s)"
        if self.skipped:
            text += "; left out: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return "\n".join([text] + [f"note: {n}" for n in self.notes])


def convert(fmt: str, path: str | Path, *, burst_window_ms: float = 10.0) -> Conversion:
    """Traffic steps from a request log: ``openai`` (JSON lines of OpenAI-style request bodies)
    or ``sglang-log`` (what SGLang writes with ``--log-requests``).  Lengths only."""
    if fmt not in CONVERT_FORMATS:
        raise WarmupError(f"unknown log format {fmt!r}", hint="one of: " + ", ".join(CONVERT_FORMATS))
    p = Path(path)
    lines = _read_lines(p, "request log", errors="replace")
    conv = _from_openai(lines, str(p)) if fmt == "openai" else \
        _from_sglang_log(lines, burst_window_ms / 1000.0)
    if not conv.steps:
        raise WarmupError(f"{p}: no request could be converted"
                          + (f" ({', '.join(f'{n} {w}' for w, n in sorted(conv.skipped.items()))})"
                             if conv.skipped else ""),
                          hint="openai: one JSON request body per line; sglang-log: a log written "
                               "with --log-requests (text or json format)")
    return conv


def _tokens(chars: int) -> int:
    """Tokens estimated from characters (about 4 per token for English text)."""
    import math

    return max(1, math.ceil(chars / 4))


def _dig(d: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # content parts: count the text ones
        return sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return 0


def _from_openai(lines: list[str], where: str) -> Conversion:
    import hashlib

    rows: list[tuple[tuple[int, ...], str, int | None, dict, str | None, int]] = []
    skipped: dict[str, int] = {}
    requests = 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        d = _json_line(line, f"{where}:{i}")
        if not isinstance(d, dict):
            raise WarmupError(f"{where}:{i}: expected a JSON object", hint="one request body per line")
        body = d["body"] if isinstance(d.get("body"), dict) else d  # batch-API input lines
        if str(d.get("url") or "").endswith("/embeddings"):
            skipped["embedding requests"] = skipped.get("embedding requests", 0) + 1
            continue
        count = next((v for v in (_dig(d, f) if _dig(d, f) is not None else _dig(body, f)
                                  for f in _TOKEN_FIELDS)
                      if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
        prompts: tuple[int, ...] = ()
        system_key, system_len, label = None, 0, "completion"
        messages = body.get("messages")
        prompt = body.get("prompt", body.get("input"))
        if isinstance(messages, list) and messages:
            label = "chat"
            prompts = (count or _tokens(sum(_text_chars(m.get("content")) for m in messages
                                            if isinstance(m, dict))),)
            first = messages[0] if isinstance(messages[0], dict) else {}
            if first.get("role") in ("system", "developer") and _text_chars(first.get("content")):
                text = json.dumps(first.get("content"), sort_keys=True)
                system_key = "sys-" + hashlib.sha256(text.encode()).hexdigest()[:8]
                system_len = _tokens(_text_chars(first.get("content")))
        elif isinstance(prompt, str):
            prompts = (count or _tokens(len(prompt)),)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompts = (len(prompt),)  # token ids: exact
        elif isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
            prompts = tuple(_tokens(len(x)) for x in prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, list) for x in prompt):
            prompts = tuple(max(1, len(x)) for x in prompt)
        elif count:
            prompts = (count,)
        if not prompts:
            skipped["without prompt, messages or token count"] = \
                skipped.get("without prompt, messages or token count", 0) + 1
            continue
        if len(prompts) > MAX_PROMPTS or max(prompts) > MAX_PROMPT_TOKENS:
            why = f"above {MAX_PROMPTS:,} prompts or {MAX_PROMPT_TOKENS:,} tokens per prompt"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        requests += len(prompts)
        sampling = {ours: body[theirs] for theirs, ours in _OPENAI_SAMPLING.items()
                    if _number(body.get(theirs))}
        mnt = next((body[k] for k in ("max_completion_tokens", "max_tokens", "max_new_tokens")
                    if _count(body.get(k), MAX_NEW_TOKENS)), None)
        rows.append((prompts, label, mnt, sampling, system_key, system_len,
                     _openai_features(body, prompts)))
    shared = {}
    for _, _, _, _, key, _, _ in rows:
        if key:
            shared[key] = shared.get(key, 0) + 1
    steps = []
    for prompts, label, mnt, sampling, key, plen, features in rows:
        group = key if key and shared[key] > 1 and all(n > plen for n in prompts) else None
        steps.append(TrafficStep("single" if len(prompts) == 1 else "batch", prompts,
                                 mnt or 16, sampling, group, plen if group else 0, label, features))
    notes = ("token counts estimated as ceil(characters / 4) where no token count field was "
             "present; a system message shared by several requests is a prefix group; n, "
             "stream, logprobs, top_logprobs and echo become request features",)
    return Conversion(tuple(steps), requests, skipped, notes)


def _openai_features(body: dict, prompts: tuple[int, ...]) -> dict[str, Any]:
    """Request features of an OpenAI request body: ``n``, ``stream``, chat ``logprobs`` /
    ``top_logprobs``, completions ``logprobs: k`` (with ``echo``: the prompt's logprobs too).
    Values out of SGLang's range are left out."""
    out: dict[str, Any] = {}
    if _count(body.get("n"), MAX_PARALLEL_SAMPLES) and body["n"] > 1:
        out["n"] = body["n"]
    if body.get("stream") is True:
        out["stream"] = True
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is True or _count(logprobs, MAX_FEATURE_IDS, minimum=0):
        out["return_logprob"] = True
        k = top if _count(top, MAX_FEATURE_IDS) else (
            logprobs if not isinstance(logprobs, bool) and logprobs else None)
        if k:
            out["top_logprobs_num"] = k
        if body.get("echo") is True:
            out["logprob_start_len"] = 0
    return out if check_features(out, prompts) is None else {}


# SGLang's request logger (srt/utils/request_logger.py, 0.5.17-0.5.23): text lines
# "[time] Finish: obj=GenerateReqInput(...), out={... 'meta_info': {...}}" or JSON lines
# {"timestamp": iso, "event": "request.finished", "rid": ..., "obj": {...}, "out": {...}}.
_META_INT = ("prompt_tokens", "completion_tokens", "cached_tokens")
_META_FLOAT = ("e2e_latency", "request_received_ts")


def _balanced(text: str, start: int) -> str | None:
    """The ``{...}`` starting at ``start``, respecting Python string quotes."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1
    return None


def _loose_json(text: str) -> Any:
    """A JSON value from a log line, or None when it is not one (never raises)."""
    try:
        return json.loads(text, parse_constant=lambda name: None)
    except (ValueError, RecursionError):
        return None


def _log_features(obj: dict, sampling: Any) -> dict[str, Any]:
    """Request features of a logged ``GenerateReqInput``."""
    out: dict[str, Any] = {}
    if obj.get("return_logprob") is True:
        out["return_logprob"] = True
        for k in ("logprob_start_len", "top_logprobs_num"):
            if _count(obj.get(k), MAX_PROMPT_TOKENS, minimum=0):
                out[k] = obj[k]
    if obj.get("stream") is True:
        out["stream"] = True
    n = sampling.get("n") if isinstance(sampling, dict) else None
    if _count(n, MAX_PARALLEL_SAMPLES) and n > 1:
        out["n"] = n
    return out


def _parse_log_line(line: str) -> dict | None:
    """One finished request of an SGLang request log: prompt/completion/cached tokens, sampling,
    arrival time (seconds) and its precision; None for other lines."""
    import ast
    import re
    from datetime import datetime

    def when(value: Any) -> float | None:
        try:
            return datetime.fromisoformat(str(value)).timestamp()
        except (ValueError, OverflowError, OSError):
            return None

    brace = line.find("{")
    if '"request.finished"' in line and brace >= 0:
        d = _loose_json(line[brace:])
        if not isinstance(d, dict):
            return None
        out, obj = d.get("out") or {}, d.get("obj") or {}
        meta = out.get("meta_info") if isinstance(out, dict) else None
        if not isinstance(meta, dict):
            return None
        rec: dict[str, Any] = {k: meta.get(k) if _count(meta.get(k), 1 << 62, minimum=0) else None
                               for k in _META_INT}
        rec.update({k: float(meta[k]) if _number(meta.get(k)) else None for k in _META_FLOAT})
        fr = meta.get("finish_reason")
        rec["finish"] = fr.get("type") if isinstance(fr, dict) else fr
        sp = obj.get("sampling_params") if isinstance(obj, dict) else None
        rec["sampling"] = sp if isinstance(sp, dict) else None
        rec["features"] = _log_features(obj if isinstance(obj, dict) else {}, sp)
        rid = d.get("rid")
        rec["rid"] = rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
        rec["logged"] = when(d.get("timestamp"))
        rec["precise"] = True
        return rec
    if '"request.received"' in line and brace >= 0:
        d = _loose_json(line[brace:])
        if not isinstance(d, dict) or not isinstance(d.get("rid"), (str, int)):
            return None
        received = when(d.get("timestamp"))
        return None if received is None else {"received_rid": d["rid"], "received": received}
    at = line.find("Finish: obj=")
    if at < 0:
        return None
    meta_at = line.rfind("'meta_info': {")
    if meta_at < 0:
        return None
    meta = line[meta_at:]
    rec: dict[str, Any] = {}
    for k in _META_INT:
        m = re.search(rf"'{k}': (\d+)", meta)
        rec[k] = int(m.group(1)) if m else None
    for k in _META_FLOAT:
        m = re.search(rf"'{k}': ([0-9.eE+-]+)", meta)
        rec[k] = float(m.group(1)) if m else None
    m = re.search(r"'finish_reason': \{'type': '(\w+)'", meta)
    rec["finish"] = m.group(1) if m else None
    sp_at = line.find("sampling_params={", at, meta_at)
    rec["sampling"] = None
    if sp_at >= 0:
        raw = _balanced(line, sp_at + len("sampling_params="))
        try:
            # Bounded before it is parsed: sampling parameters are a few dozen short fields.
            value = ast.literal_eval(raw) if raw and len(raw) <= 16384 else None
            rec["sampling"] = value if isinstance(value, dict) else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            rec["sampling"] = {k: float(v) for k, v in
                               re.findall(r"'(\w+)': (-?[0-9.]+(?:[eE][+-]?\d+)?)", raw or "")}
    head = line[at:meta_at]
    feats: dict[str, Any] = {}
    if re.search(r"\breturn_logprob=True", head):
        feats["return_logprob"] = True
        for k in ("logprob_start_len", "top_logprobs_num"):
            m = re.search(rf"\b{k}=(\d+)", head)
            if m:
                feats[k] = int(m.group(1))
    if re.search(r"\bstream=True", head):
        feats["stream"] = True
    rec["features"] = feats
    m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line)
    try:
        rec["logged"] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() if m else None
    except ValueError:
        rec["logged"] = None
    rec["precise"] = False  # the text format stamps whole seconds
    rec["rid"] = None
    return rec


def _from_sglang_log(lines: list[str], window_s: float) -> Conversion:
    received: dict[str, float] = {}
    finished: list[dict] = []
    skipped: dict[str, int] = {}

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for line in lines:
        rec = _parse_log_line(line)
        if rec is None:
            continue
        if "received_rid" in rec:
            if rec["received_rid"] is not None:
                received[str(rec["received_rid"])] = rec["received"]
            continue
        finished.append(rec)
    rows = []
    imprecise = 0
    for rec in finished:
        if rec["finish"] == "abort":
            skip("aborted")
            continue
        if rec["completion_tokens"] is None:
            skip("not generate requests (no completion_tokens)")
            continue
        if not rec["prompt_tokens"]:
            skip("without prompt_tokens")
            continue
        arrival, precise = None, False
        if rec["request_received_ts"]:
            arrival, precise = rec["request_received_ts"], True
        elif rec["rid"] is not None and str(rec["rid"]) in received:
            arrival, precise = received[str(rec["rid"])], True
        elif rec["logged"] is not None:
            arrival = rec["logged"] - (rec["e2e_latency"] or 0.0)
            precise = rec["precise"]
        if not precise:
            imprecise += 1
        if rec["prompt_tokens"] > MAX_PROMPT_TOKENS or rec["completion_tokens"] > MAX_NEW_TOKENS:
            skip(f"above {MAX_PROMPT_TOKENS:,} prompt or {MAX_NEW_TOKENS:,} completion tokens")
            continue
        sampling = {k: v for k, v in (rec["sampling"] or {}).items()
                    if k in SAMPLING_KEYS and _number(v)}
        cached = int(rec["cached_tokens"] or 0)
        features = rec.get("features") or {}
        if check_features(features, (rec["prompt_tokens"],)) is not None:
            features = {}
        rows.append((arrival, precise, int(rec["prompt_tokens"]), max(1, int(rec["completion_tokens"])),
                     sampling, cached if 0 < cached < rec["prompt_tokens"] else 0, features))
    rows.sort(key=lambda r: (r[0] is None, r[0] or 0.0))
    steps: list[TrafficStep] = []
    i = 0
    while i < len(rows):
        group = [rows[i]]
        if rows[i][1] and rows[i][0] is not None:
            while (i + len(group) < len(rows) and rows[i + len(group)][1]
                   and rows[i + len(group)][0] - rows[i][0] <= window_s):
                group.append(rows[i + len(group)])
        i += len(group)
        cached = {g[5] for g in group}
        plen = cached.pop() if len(cached) == 1 else 0
        steps.append(TrafficStep("single" if len(group) == 1 else "burst",
                                 tuple(g[2] for g in group), max(g[3] for g in group), group[0][4],
                                 f"cached{plen}" if plen else None, plen,
                                 "log" if len(group) == 1 else "log_burst", group[0][6]))
    notes = ["prompt and completion lengths are SGLang's own token counts; a prompt that hit "
             "the radix cache for N tokens shares an N-token prefix group"]
    if imprecise:
        notes.append(f"{imprecise} request(s) have only whole-second times (text format without "
                     "--enable-metrics): they are replayed one by one, not as bursts")
    return Conversion(tuple(steps), len(rows), skipped, tuple(notes))
