"""The expansion: the pure ``expand()`` that turns a plan and the server's facts into the exact
ordered list of warm-up steps, counted before it is built.

A shape's sizes are evaluated against :class:`~warmup.plan.facts.ServerFacts`; what the server
would reject (longer than the context, a batch above the request cap, a KV footprint above
capacity) is dropped with a stated reason, and whole shapes whose feature is off, whose family
is turned off or that no longer fit the request limit are skipped with theirs.  Same plan and
facts, same steps: nothing here reads the clock, the environment or a random source.

Longer than 500 lines: the expansion state and its one generator per shape kind share the
state's helpers (fits, room, skip) and read best side by side.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable, Mapping

from warmup.errors import PlanError
from warmup.plan.expr import ExprEvalError, Undefined
from warmup.plan.facts import ServerFacts
from warmup.plan.model import (FEATURES, KINDS, MAX_FEATURE_IDS, MAX_PARALLEL_SAMPLES,
                               SAMPLING_VARIANTS, Expansion, Plan, Shape, Size, SizeRange, Skip,
                               WarmupRequest, WarmupStep)


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
        self.logprobs_refused = _logprobs_refused(facts)  # why every logprob request would fail
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
    def evaluate(self, size: Size, extra: Mapping[str, Any] | None = None) -> Any:
        """``size`` over the facts (and ``extra``): a fact the server lacks skips the shape, an
        evaluation error is the plan's error at the size's place."""
        env = self.env if not extra else {**self.env, **extra}
        try:
            return size.expr.evaluate(env)
        except Undefined as u:
            raise _SkipShape(f"{size.where.path} needs {u.name}, which is not set on this server") from None
        except ExprEvalError as exc:
            raise size.where.error(str(exc), hint="fix the expression") from None

    def value(self, size: Size, extra: Mapping[str, Any] | None = None, *,
              minimum: int | None = None) -> int:
        v = self.evaluate(size, extra)
        if isinstance(v, bool) or not isinstance(v, int):
            raise size.where.error(f"`{size.expr.text}` gives {v!r}, expected an integer",
                                   hint="sizes are integer expressions")
        if minimum is not None and v < minimum:
            raise size.where.error(f"`{size.expr.text}` gives {v}, expected {minimum} or more",
                                   hint="fix the expression")
        return v

    def values(self, size: Size, extra: Mapping[str, Any] | None = None) -> list[int]:
        """A list item: one integer, or a list of integers spliced in (``batch_buckets(...)``)."""
        v = self.evaluate(size, extra)
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
        if self.logprobs_refused and ("return_logprob", True) in out:
            raise _SkipShape(self.logprobs_refused)
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

    def fits_all(self, pairs: Iterable[tuple[int, int]]) -> str | None:
        """:meth:`fits` of each (prompt length, new tokens) of one step: the first reason."""
        return next((why for why in (self.fits(n, m) for n, m in pairs) if why), None)

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
                _name_uncovered(x, phase.name, shape, x.steps[mark[0]:])
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


def _name_uncovered(x: _Expander, phase: str, shape: Shape, steps: list[WarmupStep]) -> None:
    """A class with ``covers_up_to``: the prompt lengths past what it warmed (its longest
    prompt, or what its sizes stand for: ``reaches``), up to that value, are a skip of their own
    (the log and the report name them)."""
    if shape.covers_up_to is None:
        return
    try:
        wanted = int(x.value(shape.covers_up_to))
    except _SkipShape:
        return  # the server does not say how long a prompt may be
    longest = max((r.input_len for s in steps for r in s.requests), default=0)
    if shape.reaches is not None and steps:
        try:
            longest = max(longest, int(x.value(shape.reaches)))
        except _SkipShape:
            pass  # a fact it reads is not set: what the prompts themselves reach
    if longest < wanted:
        x.skip(phase, shape, f"prompts of {longest + 1}..{wanted} tokens are not warmed: the "
                             f"class covers prompts up to {longest} (a cap in the plan or --let); they "
                             "compile at serving time", item=f"{longest + 1}..{wanted}")


def _alternate(x: _Expander) -> tuple[WarmupStep, ...]:
    """Resolve ``alternate`` sampling: greedy, default, greedy, … over requests in send order
    (background decoders first, as the driver sends them)."""
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
    chained = 0  # a chained class: the whole chunks the previous prompt put in the cache
    for n in _sizes(x, phase, shape, shape.lengths):
        whole = _chain_prefix(x, shape, n)
        req = x.request(shape, n, prefix=(f"{shape.name}/chain", whole) if whole else None)
        why = x.fits(n, req.max_new_tokens) or x.kv_fits(n + req.max_new_tokens)
        if shape.kind == "extend" and chunk is not None and n > chunk and why is None:
            why = f"{n} tokens is above chunked_prefill_size ({chunk}): it would be a chunked prompt"
        if why:
            x.skip(phase, shape, why, item=str(n))
            continue
        if shape.kind == "chunked" and chunk is not None:
            note = f"{n} tokens = {-(-n // chunk)} chunks of <= {chunk}"
            hit = min(chained, whole)
            if hit:
                note += f", the first {hit // chunk} from the cache (the previous prompts)"
            chained = max(chained, whole)
        else:
            note = f"{n} tokens ({_int_class(n)})"
        x.add(phase, shape, "single", [req], note=note)


def _chain_prefix(x: _Expander, shape: Shape, n: int) -> int:
    """With ``chain``: the tokens of an ``n``-token prompt that come from the class's one token
    stream, its whole chunks before its last token.  The next prompt hits them in the cache and
    the server computes only its later chunks, at the chunk boundaries (token counts and
    sequence lengths) it meets alone.  0 (a fresh prompt) for another kind, without chunked
    prefill or the radix cache, with a chunk that is not whole pages (the match is in pages),
    and for a class with logprobs (SGLang matches no prefix past ``logprob_start_len``)."""
    chunk, page = x.facts.chunked_prefill_size, max(1, x.facts.page_size or 1)
    features = {key for key, _ in shape.request}
    if not shape.chain or shape.kind != "chunked" or not chunk or chunk % page \
            or x.facts.disable_radix_cache or features & {"return_logprob", "logprob_start_len"}:
        return 0
    return (n - 1) // chunk * chunk


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
        why = (x.fits_all((r.input_len, r.max_new_tokens) for r in reqs)
               or x.running_fits(len(reqs))
               or x.kv_fits(sum(r.input_len + r.max_new_tokens for r in reqs)))
        if why:
            x.skip(phase, shape, why, item=f"groups[{gi}]")
            continue
        x.add(phase, shape, "concurrent", reqs,
              note=f"{len(reqs)} at once: {'+'.join(map(str, lens))} = {sum(lens)} tokens")


def _gen_batch(x: _Expander, phase: str, shape: Shape) -> None:
    budget = x.facts.prefill_budget
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
            lens = batch_lengths(bs, per, cls)
            total = sum(lens)
            why = over_budget(lens, budget, x.facts.page_size)
            if why:
                x.skip(phase, shape, f"bs={bs} {why}", item=f"bs={bs} {cls}")
                continue
            reqs = [x.request(shape, n) for n in lens]
            why = x.fits_all((n, r.max_new_tokens) for n, r in zip(lens, reqs))
            if why:
                x.skip(phase, shape, why, item=f"bs={bs} {cls}")
                continue
            x.add(phase, shape, "batch", reqs,
                  note=f"bs={bs} (pow2 {1 << (bs - 1).bit_length()}), total {total} ({_int_class(total)})")


def over_budget(lens: list[int], budget: int | None, page: int | None) -> str | None:
    """Why a batch of prompts ``lens`` would not be one prefill: more tokens than one forward
    takes, counted as SGLang's scheduler counts them against the chunk, each request in whole
    pages (``ceil_paged_tokens``), so that a batch it would split is not sent as one."""
    if budget is None:
        return None
    total = sum(lens)
    if total > budget:
        return f"total {total} tokens is above the one-forward budget ({budget})"
    page = max(page or 1, 1)
    paged = sum(-(-n // page) * page for n in lens)
    if paged > budget:
        return (f"takes {paged} tokens of the one-forward budget ({budget}) in whole pages of "
                f"{page}: the scheduler would split it")
    return None


def batch_lengths(bs: int, per: int, cls: str) -> list[int]:
    """Prompt lengths of one batch whose total is in token class ``cls`` (aligned: divisible by
    16; odd: not); each prompt at least one token."""
    per = max(per, 1)
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
        # 16..79-token prompts: wide batches stay small in KV (decode is what the class warms)
        reqs = [x.request(shape, 16 + i % 64, new_tokens=steps, ignore_eos=True) for i in range(bs)]
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
    mixed: int | None = None
    mixed_why = ""  # a mixed prompt that cannot be worked out skips its own steps, by name
    if shape.mixed_prompt is not None:
        try:
            mixed = x.value(shape.mixed_prompt)
        except _SkipShape as exc:
            mixed_why = exc.reason
    for variant in shape.variants:
        for c in conc:
            burst = [prompt + i for i in range(c)]
            _sampling_step(x, phase, shape, variant, burst, steps, f"{variant} x{c}")
            if shape.mixed_prompt is None:
                continue
            # the same burst with its last prompt of the other length (alone at x1): a
            # one-token prompt with logprobs is a logits path of its own
            item = f"{variant} x{c} with {mixed if mixed is not None else 'mixed_prompt'}"
            other = None if mixed is None else burst[:-1] + [mixed]
            if other is None:
                x.skip(phase, shape, mixed_why, item=item)
            elif other != burst:
                _sampling_step(x, phase, shape, variant, other, steps, item, mixed=True)


def _sampling_step(x: _Expander, phase: str, shape: Shape, variant: str, lengths: list[int],
                   steps: int, item: str, *, mixed: bool = False) -> None:
    """One step of a sampling class: its prompts at once, decoding ``steps`` tokens.  A step
    the server cannot take is skipped by name; a request feature it refuses for the class's
    own prompt skips the class (as for every kind), for the mixed prompt only this step."""
    why = x.running_fits(len(lengths)) or x.fits_all((n, steps) for n in lengths)
    if why:
        x.skip(phase, shape, why, item=item)
        return
    x.room(len(lengths))
    try:
        reqs = [x.request(shape, n, new_tokens=steps, variant=variant, ignore_eos=True)
                for n in lengths]
    except _SkipShape as exc:
        if not mixed:
            raise
        x.skip(phase, shape, exc.reason, item=item)
        return
    x.add(phase, shape, "concurrent" if len(lengths) > 1 else "single", reqs,
          note=f"{item}, {steps} decode steps")


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


def _logprobs_refused(facts: ServerFacts) -> str | None:
    """Why this server aborts every request that returns logprobs, or None: SGLang before
    0.5.22 refuses them under DFLASH-family speculative decoding (DFLASH, DSPARK;
    ``validate_dflash_request``).  An unknown SGLang version is not held against it."""
    if (facts.speculative_algorithm or "").upper() not in ("DFLASH", "DSPARK"):
        return None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", facts.sglang_version or "")
    if m is None or tuple(int(g) for g in m.groups()) >= (0, 5, 22):
        return None
    return (f"SGLang {facts.sglang_version} aborts requests with logprobs under "
            f"{facts.speculative_algorithm} speculative decoding (accepted from 0.5.22)")


def _int_class(n: int) -> str:
    """Triton's integer specialization class of ``n``."""
    if n == 1:
        return "1"
    return "div16" if n % 16 == 0 else "other"
