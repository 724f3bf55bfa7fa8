"""Traffic samples: request shapes (no text) to replay against a ready server.

A traffic file is JSON lines; each line is one *step* sent at once:

``{"kind": "single"|"burst"|"batch", "prompts": [len, ...], "prefix": {"group": str, "len": n},
"max_new_tokens": n, "sampling": {...}, "label": str}``

``burst`` sends the prompts as separate concurrent requests, ``batch`` as one request carrying a
list of prompts, ``single`` expects one prompt.  ``prefix`` makes every prompt of the step start
with the same ``len`` tokens as every other step of the same group (a shared system prompt, a
RAG document, an agent's growing context).  :func:`synth` writes realistic samples.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from warmup.errors import WarmupError
from warmup.plan import SAMPLING_KEYS, WarmupRequest, WarmupStep

KINDS = ("chat", "rag", "agent", "batch")
STEP_KINDS = ("single", "burst", "batch")


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

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "prompts": list(self.prompts),
                             "max_new_tokens": self.max_new_tokens, "sampling": self.sampling}
        if self.prefix_group:
            d["prefix"] = {"group": self.prefix_group, "len": self.prefix_len}
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
                                   ignore_eos=True)
                     for n in self.prompts)
        mode = {"single": "single", "burst": "concurrent", "batch": "batch"}[self.kind]
        return WarmupStep(index=index, phase="traffic", shape_class=self.label or self.kind,
                          kind="traffic", mode=mode, requests=reqs,
                          note=f"{self.kind} {'+'.join(map(str, self.prompts))}")


def load(path: str | Path) -> list[TrafficStep]:
    """Read a traffic file; errors name the line and the field."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WarmupError(f"{p}: cannot read traffic file: {exc}", hint="pass a JSON-lines file") from None
    steps = []
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise WarmupError(f"{p}:{i}: not JSON: {exc}", hint="one JSON object per line") from None
        steps.append(_parse(d, f"{p}:{i}"))
    if not steps:
        raise WarmupError(f"{p}: no traffic steps", hint="`sglang-warmup traffic synth` writes a sample")
    return steps


def _parse(d: Any, where: str) -> TrafficStep:
    if not isinstance(d, dict):
        raise WarmupError(f"{where}: expected an object", hint="see `sglang-warmup traffic synth`")
    unknown = set(d) - {"kind", "prompts", "max_new_tokens", "sampling", "prefix", "label"}
    if unknown:
        raise WarmupError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}",
                          hint="fields: kind, prompts, max_new_tokens, sampling, prefix, label")
    kind = d.get("kind", "single")
    if kind not in STEP_KINDS:
        raise WarmupError(f"{where}: kind: {kind!r} is not one of {', '.join(STEP_KINDS)}", hint="")
    prompts = d.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in prompts):
        raise WarmupError(f"{where}: prompts: expected a non-empty list of positive integers",
                          hint="prompt lengths in tokens")
    if kind == "single" and len(prompts) != 1:
        raise WarmupError(f"{where}: prompts: a single step has one prompt", hint="use burst or batch")
    mnt = d.get("max_new_tokens", 16)
    if not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 1:
        raise WarmupError(f"{where}: max_new_tokens: expected a positive integer", hint="")
    sampling = d.get("sampling") or {}
    if not isinstance(sampling, dict) or set(sampling) - SAMPLING_KEYS:
        raise WarmupError(f"{where}: sampling: keys must be among {', '.join(sorted(SAMPLING_KEYS))}", hint="")
    prefix = d.get("prefix")
    group, plen = None, 0
    if prefix is not None:
        if not isinstance(prefix, dict) or not isinstance(prefix.get("group"), str) or \
                not isinstance(prefix.get("len"), int) or prefix["len"] < 1:
            raise WarmupError(f"{where}: prefix: expected {{\"group\": str, \"len\": n}}", hint="")
        group, plen = prefix["group"], prefix["len"]
        if any(n <= plen for n in prompts):
            raise WarmupError(f"{where}: prefix: every prompt must be longer than the prefix ({plen})", hint="")
    return TrafficStep(kind=kind, prompts=tuple(prompts), max_new_tokens=mnt, sampling=dict(sampling),
                       prefix_group=group, prefix_len=plen, label=str(d.get("label", "")))


def dump(steps: Iterable[TrafficStep]) -> str:
    return "".join(json.dumps(s.to_json(), sort_keys=True) + "\n" for s in steps)


# --- synthesis ---------------------------------------------------------------------------------
_SAMPLINGS = [
    {"temperature": 0.0},
    {"temperature": 0.7, "top_p": 0.95},
    {"temperature": 0.6, "top_k": 20},
    {"temperature": 1.0, "min_p": 0.1},
    {"temperature": 0.8, "repetition_penalty": 1.05},
]


def synth(kind: str, *, seed: int = 0, steps: int = 24, max_prompt: int = 12000) -> list[TrafficStep]:
    """A realistic traffic sample of ``kind`` (chat, rag, agent, batch).  Deterministic per seed."""
    if kind not in KINDS:
        raise WarmupError(f"unknown traffic kind {kind!r}", hint="one of: " + ", ".join(KINDS))
    rng = random.Random(f"{kind}:{seed}")

    def length(lo: int, hi: int) -> int:
        # log-uniform: chat lengths are heavy-tailed
        import math

        return max(1, min(max_prompt, int(math.exp(rng.uniform(math.log(lo), math.log(hi))))))

    out: list[TrafficStep] = []
    system = length(300, 900)
    for i in range(steps):
        samp = _SAMPLINGS[rng.randrange(len(_SAMPLINGS))]
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
        else:  # batch
            bs = rng.randint(2, 24)
            out.append(TrafficStep("batch", tuple(length(50, 1500) for _ in range(bs)), length(8, 128),
                                   samp, label=f"batch_{bs}"))
    return out
