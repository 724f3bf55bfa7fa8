"""Traffic samples: request shapes (no text) to replay against a ready server.

A traffic file is JSON lines; each line is one *step* sent at once:

``{"kind": "single"|"burst"|"batch", "prompts": [len, ...], "prefix": {"group": str, "len": n},
"max_new_tokens": n, "sampling": {...}, "features": {...}, "label": str}``

``burst`` sends the prompts as separate concurrent requests, ``batch`` as one request carrying a
list of prompts, ``single`` expects one prompt.  ``prefix`` makes every prompt of the step start
with the first ``len`` tokens of its group's one token stream, so steps of a group share as
many tokens as the shorter ``len`` (a shared system prompt, a RAG document, an agent's growing
context).  ``features`` are SGLang request fields every request
of the step carries (the plan format's names: ``return_logprob``, ``logprob_start_len``,
``top_logprobs_num``, ``token_ids_logprob`` and ``stop_token_ids`` (how many ids), ``n``,
``stream``).  :func:`synth` writes realistic samples.

Every input is bounded before it is used: files above :data:`MAX_FILE_BYTES` are refused before
they are read (a FIFO within a time limit too: :mod:`cache_tools.inputfile`), a prompt is at
most :data:`MAX_PROMPT_TOKENS` tokens, a step at most :data:`MAX_PROMPTS` prompts, numbers are
finite.  A refusal is one line naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, TypeGuard

from cache_tools import inputfile
from warmup.errors import WarmupError, shown
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
STEP_FIELDS = ("kind", "prompts", "max_new_tokens", "sampling", "prefix", "features", "label")


def _count(v: Any, limit: int, minimum: int = 1) -> TypeGuard[int]:
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
        data = inputfile.read(p, MAX_FILE_BYTES)
    except inputfile.TooLarge as exc:
        raise WarmupError(f"{p}: {what} is {exc}", hint="split it, or sample part of it") from None
    except OSError as exc:
        raise WarmupError(f"{p}: cannot read {what}: {exc.strerror or exc}",
                          hint="check the path") from None
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
    steps: list[TrafficStep] = []
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if len(steps) >= MAX_STEPS:
            raise WarmupError(f"{p}:{i}: more than {MAX_STEPS:,} steps",
                              hint="sample part of the traffic")
        steps.append(parse_step(_json_line(line, f"{p}:{i}"), f"{p}:{i}"))
    if not steps:
        raise WarmupError(f"{p}: no traffic steps", hint="`sglang-warmup traffic synth` writes a sample")
    return steps


def parse_step(d: Any, where: str) -> TrafficStep:
    """One step of a traffic file (or the traffic fields of an audit file's step), every field
    checked; a refusal starts with ``where`` and names the field."""
    if not isinstance(d, dict):
        raise WarmupError(f"{where}: expected an object", hint="see `sglang-warmup traffic synth`")
    unknown = set(d) - set(STEP_FIELDS)
    if unknown:
        raise WarmupError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}",
                          hint="fields: " + ", ".join(STEP_FIELDS))
    kind = d.get("kind", "single")
    if not isinstance(kind, str) or kind not in STEP_KINDS:
        raise WarmupError(f"{where}: kind: {shown(kind)} is not one of {', '.join(STEP_KINDS)}",
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
        raise WarmupError(f"{where}: max_new_tokens: expected an integer from 1 to "
                          f"{MAX_NEW_TOKENS:,}",
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
    if not 1 <= steps <= MAX_STEPS:  # what load() accepts back
        raise WarmupError(f"steps {steps:,} is not from 1 to {MAX_STEPS:,}",
                          hint="a traffic file holds at most that many steps; write several")
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
