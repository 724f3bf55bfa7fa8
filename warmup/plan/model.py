"""The plan model: frozen Plan / Phase / Shape (what the YAML says) and WarmupRequest /
WarmupStep / Expansion (what the driver sends); :mod:`warmup.plan.expand` turns the first into
the second.

A *shape* names one class of kernel specializations (``class``) and how to produce it
(``kind``).  Expansion evaluates the shape's sizes against :class:`~warmup.plan.facts.ServerFacts`,
drops what the server would reject (longer than the context, a batch above the request cap,
a KV footprint above capacity) with a stated reason, and skips whole shapes whose feature is
off.  Same plan and facts, same steps: nothing here reads the clock, the environment or a
random source.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from warmup.errors import PlanError
from warmup.plan.expr import Expr
from warmup.plan.facts import ServerFacts

DEFAULT_MAX_REQUESTS = 5000
#: The most requests any plan may ask for (``limits.max_requests``): an expansion is counted
#: before it is built, so memory stays bounded by this whatever the server's request cap.
MAX_REQUESTS_CEILING = 50_000
#: What expansion does when the plan's classes together exceed the limit: ``skip`` the classes
#: that no longer fit (named in the skipped list; what a server at start-up wants) or ``fail``.
OVER_LIMIT = ("skip", "fail")

#: Built-in sampling variants.  ``default`` is the model's own defaults (generation config).
SAMPLING_VARIANTS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "default": {},
    "temperature": {"temperature": 0.7},
    "top_p": {"temperature": 0.8, "top_p": 0.9},
    "top_k": {"temperature": 0.8, "top_k": 40},
    "min_p": {"temperature": 0.8, "min_p": 0.05},
    "penalties": {"temperature": 0.8, "frequency_penalty": 0.5, "presence_penalty": 0.5,
                  "repetition_penalty": 1.1},
}
#: Sampling parameters a plan may set in its own variants (SGLang's SamplingParams names).
SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                           "presence_penalty", "repetition_penalty", "sampling_seed"})

#: Features a shape may require, each with the fact that tells and the skip reason.
FEATURES: dict[str, tuple[str, str]] = {
    "chunked_prefill": ("chunked_prefill_size", "chunked prefill is off (--chunked-prefill-size unset or <= 0)"),
    "radix_cache": ("radix_cache", "the radix cache is disabled (--disable-radix-cache)"),
    "mixed_chunk": ("enable_mixed_chunk", "mixed chunk is off (--enable-mixed-chunk, needs chunked prefill)"),
    "prefill_graph": ("prefill_graph", "the prefill CUDA graph is disabled"),
    "decode_graph": ("decode_graph", "decode CUDA graphs are disabled"),
    "prefill_graph_context": ("prefill_graph_context", "the prefill graph has no context bucket"),
}

#: Shape kinds and what each sends.
KINDS = ("extend", "chunked", "prefix", "concurrent", "batch", "mixed", "decode", "long_context",
         "sampling")

#: Request features a shape may turn on for every request it sends (SGLang's own field names).
#: Integer ones are expressions that may read ``input_len`` (the request's prompt length);
#: ``token_ids_logprob`` and ``stop_token_ids`` give how many token ids to send (the transport
#: picks them from the same safe id range as the prompts).
REQUEST_INT_FEATURES = ("logprob_start_len", "top_logprobs_num", "token_ids_logprob", "n",
                        "stop_token_ids")
REQUEST_BOOL_FEATURES = ("return_logprob", "stream")
REQUEST_FEATURES = REQUEST_INT_FEATURES + REQUEST_BOOL_FEATURES
#: The most a feature may ask for: parallel samples per request, top logprobs, token ids.
MAX_PARALLEL_SAMPLES = 64
MAX_FEATURE_IDS = 1024


# --- the plan (what the YAML says) ---------------------------------------------------------------
@dataclass(frozen=True)
class Located:
    """Where a value came from in the plan file: for errors found at expansion."""

    file: str
    line: int
    path: str

    def error(self, what: str, hint: str = "") -> PlanError:
        return PlanError(f"{self.file}:{self.line}: {self.path}: {what}", hint=hint)


@dataclass(frozen=True)
class Size:
    """An integer-valued expression with its location."""

    expr: Expr
    where: Located

    def __str__(self) -> str:
        return self.expr.text


@dataclass(frozen=True)
class SizeRange:
    """``{from: lo, to: hi}``: every integer from lo to hi inclusive."""

    lo: Size
    hi: Size

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi}"


@dataclass(frozen=True)
class Shape:
    """One shape class of the plan: which specializations it warms and how."""

    name: str  # the class name, unique in the plan
    kind: str
    why: str
    where: Located
    when: Size | None = None
    requires: tuple[str, ...] = ()
    sampling: str | None = None  # None: the plan default
    max_new_tokens: Size | None = None
    # kind-specific sizes; lists keep YAML order
    lengths: tuple[Size, ...] = ()  # extend, chunked
    base: Size | None = None  # prefix
    extends: tuple[Size, ...] = ()  # prefix, long_context
    prompt: Size | None = None  # mixed, long_context, sampling
    groups: tuple[tuple[Size, ...], ...] = ()  # concurrent
    batch_sizes: tuple[Size, ...] | SizeRange = ()  # batch, decode
    tokens_per_request: Size | None = None  # batch
    token_classes: tuple[str, ...] = ("aligned", "odd")  # batch
    running: tuple[Size, ...] = ()  # mixed
    decode_tokens: Size | None = None  # mixed, decode, sampling
    variants: tuple[str, ...] = ()  # sampling
    concurrency: tuple[Size, ...] = ()  # sampling
    mixed_prompt: Size | None = None  # sampling: a second length, mixed into every burst
    #: request features for every request of the class, e.g. (("return_logprob", True), ...)
    request: tuple[tuple[str, "Size | bool"], ...] = ()
    #: the family a user can turn off as a whole (default: the kind)
    family: str = ""
    #: the longest prompt the class means to cover (lengths past what it warmed are named)
    covers_up_to: Size | None = None
    #: the longest prompt its sizes stand for (one size per kernel key), past its longest prompt
    reaches: Size | None = None
    #: chunked: each prompt starts with the previous prompts' whole chunks (a radix hit)
    chain: bool = False

    @property
    def family_name(self) -> str:
        return self.family or self.kind


@dataclass(frozen=True)
class Phase:
    """An ordered group of shapes; the driver reports progress per phase."""

    name: str
    shapes: tuple[Shape, ...]


@dataclass(frozen=True)
class Plan:
    """A loaded, validated plan (``version: 1``)."""

    name: str
    description: str
    file: str
    phases: tuple[Phase, ...]
    let: tuple[tuple[str, Size], ...] = ()
    sampling: str = "alternate"
    max_new_tokens: int = 1
    max_requests: int = DEFAULT_MAX_REQUESTS
    over_limit: str = "skip"
    flush: bool = True
    sampling_variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source_sha256: str = ""

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return tuple(s for p in self.phases for s in p.shapes)


# --- the expansion (what the driver sends) -------------------------------------------------------
@dataclass(frozen=True)
class WarmupRequest:
    """One generate request.  Prompt tokens are the first ``prefix_len`` tokens of the token
    stream ``prefix_key`` (one stream per key: two requests of a key share the first ``min`` of
    their ``prefix_len`` tokens, so the radix cache hits there), then fresh tokens up to
    ``input_len``."""

    input_len: int
    max_new_tokens: int
    sampling_name: str
    sampling_params: tuple[tuple[str, Any], ...]
    prefix_key: str | None = None
    prefix_len: int = 0
    ignore_eos: bool = False
    #: request features (names of :data:`REQUEST_FEATURES`) with their evaluated values
    features: tuple[tuple[str, Any], ...] = ()

    @property
    def sampling(self) -> dict[str, Any]:
        return dict(self.sampling_params)

    @property
    def samples(self) -> int:
        """Sequences this request runs at once (``n`` parallel samples)."""
        return int(dict(self.features).get("n", 1))


@dataclass(frozen=True)
class WarmupStep:
    """Requests sent together.  ``mode``: ``single`` (one request), ``concurrent`` (separate
    requests issued at once), ``batch`` (one request carrying a list of prompts: one batched
    extend), ``mixed`` (``background`` decoders start first, then ``requests`` arrive while
    they decode)."""

    index: int
    phase: str
    shape_class: str
    kind: str
    mode: str
    requests: tuple[WarmupRequest, ...]
    note: str = ""
    background: tuple[WarmupRequest, ...] = ()

    @property
    def num_requests(self) -> int:
        return len(self.requests) + len(self.background)

    @property
    def sequences(self) -> int:
        """Running sequences the step puts on the server (``n`` counts ``n`` times)."""
        return sum(r.samples for r in (*self.requests, *self.background))

    @property
    def tokens(self) -> int:
        return sum(r.input_len for r in self.requests) + sum(r.input_len for r in self.background)


@dataclass(frozen=True)
class Skip:
    """A shape (or one of its sizes) that expansion left out, and why."""

    phase: str
    shape_class: str
    reason: str
    item: str = ""  # empty: the whole shape


@dataclass(frozen=True)
class Expansion:
    """The ordered steps of one plan against one set of facts."""

    plan: str
    steps: tuple[WarmupStep, ...]
    skipped: tuple[Skip, ...]
    flush: bool
    facts: ServerFacts
    plan_sha256: str = ""
    #: settings the plan found worth a warning (the warm-up still runs)
    warnings: tuple[str, ...] = ()
    #: the launch's server arguments, each as a short hash (``step_record.server_args_of``):
    #: what a steps record compares beyond the facts; empty outside a server; not in the digest
    server_args: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(s.num_requests for s in self.steps)

    @property
    def classes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for s in self.steps:
            seen.setdefault(s.shape_class, None)
        return tuple(seen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "plan_sha256": self.plan_sha256,
            "flush": self.flush,
            "num_steps": len(self.steps),
            "num_requests": self.num_requests,
            "steps": [
                {"index": s.index, "phase": s.phase, "class": s.shape_class, "kind": s.kind,
                 "mode": s.mode, "note": s.note,
                 "requests": [_req_dict(r) for r in s.requests],
                 "background": [_req_dict(r) for r in s.background]}
                for s in self.steps
            ],
            "skipped": [{"phase": k.phase, "class": k.shape_class, "item": k.item,
                         "reason": k.reason} for k in self.skipped],
            "warnings": list(self.warnings),
            "facts": self.facts.to_dict(),
        }

    def digest(self) -> str:
        """A stable hash of every request the driver sends: the steps, each request's sampling
        parameters by value (not only their name: an edited plan can keep a name and change a
        penalty behind it), and how the prompts' tokens are made (for the run report and for
        steps records; the flush after the last step is not in it)."""
        steps = self.to_dict()["steps"]
        for d, s in zip(steps, self.steps):
            for key, reqs in (("requests", s.requests), ("background", s.background)):
                for rd, r in zip(d[key], reqs):
                    rd["params"] = dict(r.sampling_params)
        body = json.dumps({"steps": steps, "tokens": TOKEN_SCHEME}, sort_keys=True,
                          default=_number).encode()
        return hashlib.sha256(body).hexdigest()[:16]

    def prefix_hits(self) -> dict[tuple[int, int], PrefixHit]:
        """What the radix cache holds of each request when it arrives, for the requests that
        start with tokens of a prefix stream an earlier step sent; keyed by ``(step index,
        position among the step's requests, then its background)``.

        SGLang's match, modelled: the tokens the request shares with one earlier request of its
        stream (the first ``min`` of their ``prefix_len``), never its last token nor past its
        ``logprob_start_len`` with logprobs, in whole pages; the source is the first step
        whose request gives the most (the one that put it there).  Requests of one step do not
        hit each other (they arrive together); nothing hits without the radix cache."""
        if self.facts.disable_radix_cache:
            return {}
        page = max(1, self.facts.page_size or 1)
        sent: dict[str, dict[int, int]] = {}  # stream -> prefix_len -> the first step
        out: dict[tuple[int, int], PrefixHit] = {}
        for s in self.steps:
            reqs = (*s.requests, *s.background)
            for pos, r in enumerate(reqs):
                if not r.prefix_key or r.prefix_len < 1:
                    continue
                limit = min(r.prefix_len, r.input_len - 1, _logprob_limit(r))
                most, first = max(((min(plen, limit), -idx)
                                   for plen, idx in sent.get(r.prefix_key, {}).items()),
                                  default=(0, 0))
                if most // page:
                    out[(s.index, pos)] = PrefixHit(most // page * page, -first)
            for r in reqs:
                if r.prefix_key and r.prefix_len > 0:  # what its prompt holds of the stream
                    sent.setdefault(r.prefix_key, {}).setdefault(min(r.prefix_len, r.input_len),
                                                                 s.index)
        return out


#: how the transports make prompt tokens from a request; part of the digest, so that a steps
#: record learned on other prompts does not match (2: one token stream per prefix key)
TOKEN_SCHEME = 2


@dataclass(frozen=True)
class PrefixHit:
    """What the radix cache holds of a request when it arrives: ``tokens`` of its prompt, put
    there by the request of step ``source`` (:meth:`Expansion.prefix_hits`)."""

    tokens: int
    source: int


def _logprob_limit(r: WarmupRequest) -> int:
    """SGLang matches no prefix past the position input logprobs start from."""
    f = dict(r.features)
    start = f.get("logprob_start_len")
    if f.get("return_logprob") and isinstance(start, int) and start >= 0:
        return start
    return r.input_len


def _number(o: Any) -> Any:
    """A parameter JSON cannot hold, as the number it is (a numpy scalar from a model's
    generation config); anything else by its ``repr``: one with an address differs in every
    process, so a record never applies on it (never a false match)."""
    item = getattr(o, "item", None)
    return item() if callable(item) else repr(o)


def _req_dict(r: WarmupRequest) -> dict[str, Any]:
    d: dict[str, Any] = {"input_len": r.input_len, "max_new_tokens": r.max_new_tokens,
                         "sampling": r.sampling_name}
    if r.prefix_key:
        d["prefix"] = {"key": r.prefix_key, "len": r.prefix_len}
    if r.ignore_eos:
        d["ignore_eos"] = True
    if r.features:
        d["features"] = dict(r.features)
    return d
