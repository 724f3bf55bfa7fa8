"""Plans: frozen Plan / Phase / Shape, and the pure ``expand()`` that turns a plan and the
server's facts into the exact ordered list of warm-up steps.

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
from typing import Any, Iterable, Mapping

from warmup.errors import PlanError
from warmup.plan.expr import Expr, ExprEvalError, Undefined
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
    #: request features for every request of the class, e.g. (("return_logprob", True), ...)
    request: tuple[tuple[str, "Size | bool"], ...] = ()
    #: the family a user can turn off as a whole (default: the kind)
    family: str = ""

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
    """One generate request.  Prompt tokens are ``prefix_len`` tokens of the shared prefix
    ``prefix_key`` (identical across requests with the same key, so the radix cache hits),
    then fresh tokens up to ``input_len``."""

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
        """A stable hash of the steps (for tests and for the run report)."""
        body = json.dumps(self.to_dict()["steps"], sort_keys=True).encode()
        return hashlib.sha256(body).hexdigest()[:16]


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


class _SkipShape(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _OverLimit(_SkipShape):
    """The class would take the expansion above its request limit."""


class _Expander:
    """Expansion state: the environment, the step list and the sampling alternation."""

    def __init__(self, plan: Plan, facts: ServerFacts, limit: int) -> None:
        self.plan = plan
        self.facts = facts
        self.limit = limit
        self.count = 0  # requests in self.steps
        self.env: dict[str, Any] = facts.env()
        self.steps: list[WarmupStep] = []
        self.skipped: list[Skip] = []
        self.warnings: list[str] = []
        for name, size in plan.let:
            try:
                self.env[name] = size.expr.evaluate(self.env)
            except Undefined:
                self.env[name] = None  # an undefined let is itself "not set"
            except ExprEvalError as exc:
                raise size.where.error(str(exc), hint="fix the expression") from None

    # -- evaluation helpers
    def value(self, size: Size, extra: Mapping[str, Any] | None = None, *,
              minimum: int | None = None) -> int:
        env = self.env if not extra else {**self.env, **extra}
        try:
            v = size.expr.evaluate(env)
        except Undefined as u:
            raise _SkipShape(f"{size.where.path} needs {u.name}, which is not set on this server") from None
        except ExprEvalError as exc:
            raise size.where.error(str(exc), hint="fix the expression") from None
        if isinstance(v, bool) or not isinstance(v, int):
            raise size.where.error(f"`{size.expr.text}` gives {v!r}, expected an integer",
                                   hint="sizes are integer expressions")
        if minimum is not None and v < minimum:
            raise size.where.error(f"`{size.expr.text}` gives {v}, expected {minimum} or more",
                                   hint="fix the expression")
        return v

    def values(self, size: Size, extra: Mapping[str, Any] | None = None) -> list[int]:
        """A list item: one integer, or a list of integers spliced in (``batch_buckets(...)``)."""
        env = self.env if not extra else {**self.env, **extra}
        try:
            v = size.expr.evaluate(env)
        except Undefined as u:
            raise _SkipShape(f"{size.where.path} needs {u.name}, which is not set on this server") from None
        except ExprEvalError as exc:
            raise size.where.error(str(exc), hint="fix the expression") from None
        items = v if isinstance(v, list) else [v]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int):
                raise size.where.error(f"`{size.expr.text}` gives {v!r}, expected an integer or a "
                                       "list of integers", hint="sizes are integer expressions")
        return items

    def truth(self, size: Size) -> bool:
        try:
            return bool(size.expr.evaluate(self.env))
        except Undefined as u:
            raise _SkipShape(f"condition `{size.expr.text}` needs {u.name}, which is not set on this server") from None
        except ExprEvalError as exc:
            raise size.where.error(str(exc), hint="fix the expression") from None

    def sampling_for(self, name: str) -> tuple[tuple[str, Any], ...]:
        if name == "default":
            params = dict(self.facts.default_sampling_params)
        else:
            params = dict(self.plan.sampling_variants.get(name) or SAMPLING_VARIANTS[name])
        return tuple(sorted(params.items()))

    def request(self, shape: Shape, input_len: int, *, new_tokens: int | None = None,
                prefix: tuple[str, int] | None = None, variant: str | None = None,
                ignore_eos: bool | None = None) -> WarmupRequest:
        mnt = new_tokens if new_tokens is not None else (
            self.value(shape.max_new_tokens) if shape.max_new_tokens else self.plan.max_new_tokens)
        # "alternate" is resolved once all steps exist (see _alternate), so skipped sizes
        # do not shift the greedy/default alternation.
        name = variant or shape.sampling or self.plan.sampling
        params = () if name == "alternate" else self.sampling_for(name)
        return WarmupRequest(input_len=input_len, max_new_tokens=mnt, sampling_name=name,
                             sampling_params=params,
                             prefix_key=prefix[0] if prefix else None,
                             prefix_len=prefix[1] if prefix else 0,
                             ignore_eos=bool(ignore_eos if ignore_eos is not None else mnt > 1),
                             features=self.features(shape, input_len))

    def features(self, shape: Shape, input_len: int) -> tuple[tuple[str, Any], ...]:
        """The shape's request features for a prompt of ``input_len`` tokens, checked against
        what SGLang accepts; a value it would reject skips the class with the reason."""
        out: list[tuple[str, Any]] = []
        for key, spec in shape.request:
            if isinstance(spec, bool):
                if spec:
                    out.append((key, True))
                continue
            v = self.value(spec, {"input_len": input_len}, minimum=0)
            if key == "logprob_start_len" and v >= input_len:
                raise _SkipShape(f"logprob_start_len {v} is not below the prompt length "
                                 f"{input_len}")
            if key == "n" and not 1 <= v <= MAX_PARALLEL_SAMPLES:
                raise _SkipShape(f"n = {v} parallel samples: expected 1..{MAX_PARALLEL_SAMPLES}")
            if key in ("top_logprobs_num", "token_ids_logprob", "stop_token_ids"):
                vocab = self.facts.vocab_size
                limit = min(MAX_FEATURE_IDS, vocab) if vocab else MAX_FEATURE_IDS
                if v > limit:
                    raise _SkipShape(f"{key} = {v} is above {limit}")
            out.append((key, v))
        if out and any(k in ("logprob_start_len", "top_logprobs_num", "token_ids_logprob")
                       for k, _ in out) and ("return_logprob", True) not in out:
            out.append(("return_logprob", True))
        return tuple(sorted(out))

    # -- limits the server would enforce
    def fits(self, input_len: int, new_tokens: int) -> str | None:
        """None if the server accepts a prompt of this length, else why not."""
        if input_len < 1:
            return f"{input_len} tokens: a prompt needs at least 1 token"
        limit = self.facts.max_input_len
        if limit is not None and input_len > limit:
            return f"{input_len} tokens is above the longest accepted prompt ({limit})"
        ctx = self.facts.context_length
        if ctx is not None and input_len + new_tokens > ctx:
            return f"{input_len}+{new_tokens} tokens is above the context length ({ctx})"
        return None

    def kv_fits(self, tokens: int) -> str | None:
        cap = self.facts.max_total_tokens
        if cap is not None and tokens > cap:
            return f"{tokens} tokens in flight is above the KV capacity ({cap})"
        return None

    def running_fits(self, n: int) -> str | None:
        cap = self.facts.max_running_requests
        if cap is not None and n > cap:
            return f"{n} requests at once is above max_running_requests ({cap})"
        return None

    def room(self, n: int) -> None:
        """Called before building ``n`` more requests: refuses what would pass the limit, so
        an expansion never holds more than the limit in memory."""
        if self.count + n > self.limit:
            raise _OverLimit(f"expansion limit: {n} more request(s) would bring the plan to "
                             f"{self.count + n}, above the limit of {self.limit}")

    def add(self, phase: str, shape: Shape, mode: str, requests: Iterable[WarmupRequest],
            note: str = "", background: Iterable[WarmupRequest] = ()) -> None:
        requests, background = tuple(requests), tuple(background)
        sequences = sum(r.samples for r in (*requests, *background))
        if sequences > len(requests) + len(background):
            why = self.running_fits(sequences)
            if why:
                raise _SkipShape(f"with n parallel samples, {why}")
        self.room(len(requests) + len(background))
        self.count += len(requests) + len(background)
        self.steps.append(WarmupStep(index=len(self.steps), phase=phase, shape_class=shape.name,
                                     kind=shape.kind, mode=mode, requests=tuple(requests),
                                     note=note, background=tuple(background)))

    def skip(self, phase: str, shape: Shape, reason: str, item: str = "") -> None:
        self.skipped.append(Skip(phase=phase, shape_class=shape.name, reason=reason, item=item))


def expand(plan: Plan, facts: ServerFacts, *, max_requests: int | None = None,
           over_limit: str | None = None, skip_families: Iterable[str] = ()) -> Expansion:
    """Expand ``plan`` against ``facts`` into ordered steps.  Pure and deterministic.

    Requests are counted before they are built.  A class that would take the total above the
    limit (``max_requests``, else the plan's ``limits.max_requests``) is skipped with the reason
    when ``over_limit`` (else the plan's ``limits.over_limit``) is ``skip``: later, smaller
    classes still run.  With ``fail`` the first such class raises a PlanError.
    ``skip_families``: families (a shape's ``family``, else its kind) the user turned off."""
    limit = max_requests if max_requests is not None else plan.max_requests
    policy = over_limit or plan.over_limit
    off = tuple(dict.fromkeys(skip_families))
    x = _Expander(plan, facts, limit)
    present = {s.family_name for s in plan.shapes}
    for name in off:
        if name not in present:
            x.warnings.append(f"family {name!r} was turned off, but no class of the plan is in "
                              f"it (families: {', '.join(sorted(present))})")
    for phase in plan.phases:
        for shape in phase.shapes:
            mark = (len(x.steps), len(x.skipped), x.count)
            try:
                if shape.family_name in off:
                    raise _SkipShape(f"family {shape.family_name!r} is turned off")
                for feature in shape.requires:
                    fact, reason = FEATURES[feature]
                    if not x.env.get(fact):
                        raise _SkipShape(reason)
                if shape.when is not None and not x.truth(shape.when):
                    raise _SkipShape(f"condition `{shape.when.expr.text}` is false on this server")
                _GENERATORS[shape.kind](x, phase.name, shape)
            except _SkipShape as s:
                if isinstance(s, _OverLimit) and policy == "fail":
                    raise PlanError(f"{plan.file}:{shape.where.line}: {shape.where.path}: class "
                                    f"{shape.name}: {s.reason}",
                                    hint="shrink the plan's sizes, raise limits.max_requests, or "
                                         "set limits.over_limit: skip") from None
                del x.steps[mark[0]:]
                del x.skipped[mark[1]:]
                x.count = mark[2]
                x.skip(phase.name, shape, s.reason)
    return Expansion(plan=plan.name, steps=_alternate(x), skipped=tuple(x.skipped),
                     flush=plan.flush, facts=facts, plan_sha256=plan.source_sha256,
                     warnings=tuple(dict.fromkeys(x.warnings)))


def _alternate(x: _Expander) -> tuple[WarmupStep, ...]:
    """Resolve ``alternate`` sampling: greedy, default, greedy, … over requests in send order
    (background decoders first, as the driver sends them)."""
    from dataclasses import replace

    counter = 0
    greedy, default = x.sampling_for("greedy"), x.sampling_for("default")

    def fix(r: WarmupRequest) -> WarmupRequest:
        nonlocal counter
        if r.sampling_name != "alternate":
            return r
        pick = counter % 2
        counter += 1
        return replace(r, sampling_name=("greedy", "default")[pick], sampling_params=(greedy, default)[pick])

    out = []
    for s in x.steps:
        bg = tuple(fix(r) for r in s.background)
        out.append(replace(s, background=bg, requests=tuple(fix(r) for r in s.requests)))
    return tuple(out)


# --- generators, one per kind ------------------------------------------------------------------
def _sizes(x: _Expander, phase: str, shape: Shape, sizes: Iterable[Size] | SizeRange,
           extra: Mapping[str, Any] | None = None) -> list[int]:
    """Evaluate a list of sizes; an undefined item is skipped alone; duplicates are dropped."""
    if isinstance(sizes, SizeRange):
        lo, hi = x.value(sizes.lo, extra), x.value(sizes.hi, extra)
        if hi - lo >= x.limit:
            raise sizes.hi.where.error(f"range {lo}..{hi} has more than {x.limit} values",
                                       hint="narrow the range")
        return list(range(lo, hi + 1))
    out: list[int] = []
    for size in sizes:
        try:
            values = x.values(size, extra)
        except _SkipShape as s:
            x.skip(phase, shape, s.reason, item=size.expr.text)
            continue
        out.extend(v for v in values if v not in out)
    return out


def _gen_extend(x: _Expander, phase: str, shape: Shape) -> None:
    chunk = x.facts.chunked_prefill_size
    for n in _sizes(x, phase, shape, shape.lengths):
        req = x.request(shape, n)
        why = x.fits(n, req.max_new_tokens) or x.kv_fits(n + req.max_new_tokens)
        if shape.kind == "extend" and chunk is not None and n > chunk and why is None:
            why = f"{n} tokens is above chunked_prefill_size ({chunk}): it would be a chunked prompt"
        if why:
            x.skip(phase, shape, why, item=str(n))
            continue
        if shape.kind == "chunked" and chunk is not None:
            note = f"{n} tokens = {-(-n // chunk)} chunks of <= {chunk}"
        else:
            note = f"{n} tokens ({_int_class(n)})"
        x.add(phase, shape, "single", [req], note=note)


def _gen_prefix(x: _Expander, phase: str, shape: Shape, *, base_size: Size | None = None,
                align: bool = True) -> None:
    """A base prompt, then prompts that extend its cached part by exactly d new tokens each.

    Radix hits are page-granular and never cover a prompt's last token.  With ``align`` the
    base is rounded up to whole pages, so the whole base is the hit.  Without it (a prompt past
    the context bucket, whose own length matters) the base keeps its length and the hit is its
    whole pages: each extend is then that page-aligned prefix plus d fresh tokens, so the server
    computes exactly d tokens (1, 37, K + 37 mean what they say)."""
    base_expr = base_size or shape.base
    assert base_expr is not None
    base = x.value(base_expr)
    page = x.facts.page_size
    if align and base % page:
        base = -(-base // page) * page
    hit = (base // page) * page
    key = f"{shape.name}/base{base}"
    first = x.request(shape, base, prefix=(key, base))
    why = x.fits(base, first.max_new_tokens) or x.kv_fits(base + first.max_new_tokens)
    if why:
        raise _SkipShape(f"base prompt: {why}")
    if hit < 1:
        raise _SkipShape(f"base prompt of {base} tokens holds no whole page ({page}) to hit")
    chunk = x.facts.chunked_prefill_size
    chunks = f", {-(-base // chunk)} chunks" if chunk and base > chunk else ""
    steps = [(first, f"prefix base {base} tokens ({_int_class(base)}{chunks})")]
    for d in _sizes(x, phase, shape, shape.extends):
        if d < 1:
            x.skip(phase, shape, f"extend of {d} tokens: a prefix hit needs at least 1 new token", item=str(d))
            continue
        req = x.request(shape, hit + d, prefix=(key, hit))
        why = x.fits(hit + d, req.max_new_tokens) or x.kv_fits(hit + d + req.max_new_tokens)
        if why:
            x.skip(phase, shape, why, item=f"+{d}")
            continue
        steps.append((req, f"hit on {hit} + extend {d} ({_int_class(d)})"))
    if len(steps) == 1:
        raise _SkipShape("no extend fits on the prefix")
    for req, note in steps:
        x.add(phase, shape, "single", [req], note=note)


def _gen_long_context(x: _Expander, phase: str, shape: Shape) -> None:
    _gen_prefix(x, phase, shape, base_size=shape.prompt, align=False)


def _gen_concurrent(x: _Expander, phase: str, shape: Shape) -> None:
    for gi, group in enumerate(shape.groups):
        lens = []
        for size in group:
            try:
                lens.append(x.value(size))
            except _SkipShape as s:
                x.skip(phase, shape, s.reason, item=f"groups[{gi}]")
                lens = []
                break
        if not lens:
            continue
        x.room(len(lens))
        reqs = [x.request(shape, n) for n in lens]
        why = (next((w for w in (x.fits(r.input_len, r.max_new_tokens) for r in reqs) if w), None)
               or x.running_fits(len(reqs))
               or x.kv_fits(sum(r.input_len + r.max_new_tokens for r in reqs)))
        if why:
            x.skip(phase, shape, why, item=f"groups[{gi}]")
            continue
        x.add(phase, shape, "concurrent", reqs,
              note=f"{len(reqs)} at once: {'+'.join(map(str, lens))} = {sum(lens)} tokens")


def _gen_batch(x: _Expander, phase: str, shape: Shape) -> None:
    limits = [v for v in (x.facts.chunked_prefill_size, x.facts.prefill_graph_max_bucket,
                          x.facts.max_prefill_tokens) if v]
    budget = min(limits) if limits else None
    for bs in _sizes(x, phase, shape, shape.batch_sizes):
        if bs < 1:
            x.skip(phase, shape, f"batch size {bs} is below 1", item=f"bs={bs}")
            continue
        why = x.running_fits(bs)
        if why:
            x.skip(phase, shape, why, item=f"bs={bs}")
            continue
        per = x.value(shape.tokens_per_request, {"bs": bs}) if shape.tokens_per_request else 64
        for cls in shape.token_classes:
            x.room(bs)
            lens = _batch_lengths(bs, per, cls)
            total = sum(lens)
            if budget is not None and total > budget:
                x.skip(phase, shape, f"bs={bs} total {total} tokens is above the one-forward "
                       f"budget ({budget})", item=f"bs={bs} {cls}")
                continue
            reqs = [x.request(shape, n) for n in lens]
            why = next((w for w in (x.fits(n, r.max_new_tokens) for n, r in zip(lens, reqs)) if w), None)
            if why:
                x.skip(phase, shape, why, item=f"bs={bs} {cls}")
                continue
            x.add(phase, shape, "batch", reqs,
                  note=f"bs={bs} (pow2 {1 << (bs - 1).bit_length()}), total {total} ({_int_class(total)})")


def _batch_lengths(bs: int, per: int, cls: str) -> list[int]:
    """Prompt lengths of one batch whose total is in token class ``cls`` (aligned: divisible by
    16; odd: not)."""
    per = max(per, 2)
    lens = [per] * bs
    total = per * bs
    if cls == "aligned":
        if total % 16:
            lens[-1] += 16 - total % 16
    elif total % 16 == 0:
        lens[-1] += 1
    return lens


def _gen_mixed(x: _Expander, phase: str, shape: Shape) -> None:
    assert shape.prompt is not None
    prompt = x.value(shape.prompt)
    chunk, buckets = x.facts.chunked_prefill_size, x.facts.prefill_graph_buckets
    if x.facts.prefill_graph and chunk and buckets and chunk not in buckets:
        above = [b for b in buckets if b >= chunk]
        fate = f"pads to the {min(above)}-token graph" if above else "runs eager"
        x.warnings.append(
            f"{shape.name}: a steady mixed step is {chunk} tokens (chunked_prefill_size), not a "
            f"captured prefill-graph size, so it {fate}; add {chunk} to --cuda-graph-bs-prefill")
    steps = x.value(shape.decode_tokens) if shape.decode_tokens else 48
    for k in _sizes(x, phase, shape, shape.running):
        why = x.running_fits(k + 1)
        if why:
            x.skip(phase, shape, why, item=f"running={k}")
            continue
        x.room(k + 1)
        background = [x.request(shape, 32, new_tokens=steps, ignore_eos=True) for _ in range(k)]
        req = x.request(shape, prompt)
        why = x.fits(prompt, req.max_new_tokens) or x.kv_fits(prompt + k * (32 + steps))
        if why:
            x.skip(phase, shape, why, item=f"running={k}")
            continue
        chunk = x.facts.chunked_prefill_size or prompt
        x.add(phase, shape, "mixed", [req], background=background,
              note=f"{k} decoding + a {prompt}-token prompt (prefill part {chunk - k}, "
                   f"{_int_class(chunk - k)})")


def _gen_decode(x: _Expander, phase: str, shape: Shape) -> None:
    steps = x.value(shape.decode_tokens) if shape.decode_tokens else 8
    for bs in _sizes(x, phase, shape, shape.batch_sizes):
        why = x.running_fits(bs)
        if why:
            x.skip(phase, shape, why, item=f"bs={bs}")
            continue
        x.room(bs)
        reqs = [x.request(shape, 16 + i, new_tokens=steps, ignore_eos=True) for i in range(bs)]
        why = x.kv_fits(sum(r.input_len + steps for r in reqs))
        if why:
            x.skip(phase, shape, why, item=f"bs={bs}")
            continue
        bd = x.facts.decode_graph_max_bs
        where = "eager" if bd is not None and bs > bd else "graph"
        x.add(phase, shape, "concurrent", reqs, note=f"{bs} decoding together ({where}), {steps} steps")


def _gen_sampling(x: _Expander, phase: str, shape: Shape) -> None:
    assert shape.prompt is not None
    prompt = x.value(shape.prompt)
    steps = x.value(shape.decode_tokens) if shape.decode_tokens else 16
    conc = _sizes(x, phase, shape, shape.concurrency) if shape.concurrency else [1]
    for variant in shape.variants:
        for c in conc:
            why = x.running_fits(c) or x.fits(prompt, steps)
            if why:
                x.skip(phase, shape, why, item=f"{variant} x{c}")
                continue
            x.room(c)
            reqs = [x.request(shape, prompt + i, new_tokens=steps, variant=variant, ignore_eos=True)
                    for i in range(c)]
            x.add(phase, shape, "concurrent" if c > 1 else "single", reqs,
                  note=f"{variant} x{c}, {steps} decode steps")


_GENERATORS = {
    "extend": _gen_extend,
    "chunked": _gen_extend,
    "prefix": _gen_prefix,
    "concurrent": _gen_concurrent,
    "batch": _gen_batch,
    "mixed": _gen_mixed,
    "decode": _gen_decode,
    "long_context": _gen_long_context,
    "sampling": _gen_sampling,
}
assert set(_GENERATORS) == set(KINDS)


def _int_class(n: int) -> str:
    """Triton's integer specialization class of ``n``."""
    if n == 1:
        return "1"
    return "div16" if n % 16 == 0 else "other"
