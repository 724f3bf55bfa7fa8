"""Learn: turn the post-ready misses an audit attributed to traffic steps into plan classes
that would have compiled them during the warm-up, and merge them into a plan.

Each traffic step that missed is reproduced with what plan format v1 can express, against the
audited server's facts (page size, chunk size, request cap):

* a single prompt: an ``extend`` length (``chunked`` above the chunk size), or, when its prefix
  group was already cached in that pass, a ``prefix`` hit on the cached whole pages with the
  same number of new tokens;
* a burst of concurrent prompts: a ``concurrent`` group of the tokens each request computes
  (split at the request cap), plus the ``prefix`` hits when the prefix was cached;
* a batched request: a ``batch`` of the same size, the mean prompt length per request and the
  same total-token class (divisible by 16 or not);
* its sampling parameters: a ``sampling`` variant, unless the plan already sends them.

Items the plan's own expansion already sends identically are not proposed again; a step whose
items are all in the plan is reported as unexplained (what compiled depends on something the
plan format cannot express).  The result is new classes in a new phase (default ``learned``),
printed as YAML, as a unified diff against the plan, or written as the merged plan, which is
loaded and expanded again before anything is printed or written.

Longer than 500 lines: a miss becomes a class through one chain (read, index, collect, write
YAML that keeps the plan's own text); each link is small and only this chain uses it.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from cache_tools import atomic, compile_log
from warmup.coverage import audit_file
from warmup.plan import loader
from warmup.errors import PlanError, WarmupError
from warmup.plan.facts import ServerFacts
from warmup.plan.model import SAMPLING_KEYS, SAMPLING_VARIANTS, Expansion, Plan
from warmup.plan.expand import batch_lengths, expand, over_budget

#: Steps named in a class's ``why`` before "and N more".
_WHY_STEPS = 6


@dataclass(frozen=True)
class Miss:
    """A traffic step with post-ready misses: where it came from and what it sent."""

    audit: str
    index: int
    label: str
    kind: str
    prompts: tuple[int, ...]
    prefix_len: int
    prefix_cached: bool
    sampling: tuple[tuple[str, Any], ...]
    max_new_tokens: int
    events: int
    kernels: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{Path(self.audit).name} step {self.index} ({self.label or self.kind})"

    def to_json(self) -> dict[str, Any]:
        return {"audit": self.audit, "index": self.index, "label": self.label, "kind": self.kind,
                "prompts": list(self.prompts), "prefix_len": self.prefix_len,
                "prefix_cached": self.prefix_cached, "sampling": dict(self.sampling),
                "max_new_tokens": self.max_new_tokens, "events": self.events,
                "kernels": list(self.kernels)}


@dataclass(frozen=True)
class Learned:
    """What ``learn`` found and proposes.

    ``shapes``: the new classes (YAML mappings, in output order) of phase ``phase``;
    ``sampling_variants``: new named variants they use; ``covered``: items the plan already
    sends, with the class that sends them; ``unexplained``: steps whose every item is already
    in the plan; ``skipped``: learned items the merged plan's expansion leaves out on the
    audited server, with the reason; ``unattributed``: compile events during the audits that
    no step caused.
    """

    sources: tuple[str, ...]
    plan_file: str
    phase: str
    misses: tuple[Miss, ...]
    shapes: tuple[Mapping[str, Any], ...]
    sampling_variants: Mapping[str, Mapping[str, Any]]
    covered: tuple[str, ...]
    unexplained: tuple[str, ...]
    skipped: tuple[str, ...]
    unattributed: int
    original_text: str
    merged_text: str
    notes: tuple[str, ...] = ()
    added_requests: int = 0

    @property
    def empty(self) -> bool:
        return not self.shapes

    def snippet(self) -> str:
        """The learned stanzas as YAML to merge under the plan's top level."""
        events = sum(m.events for m in self.misses)
        head = [f"# sglang-warmup learn: {events} post-ready compile event(s) in "
                f"{len(self.misses)} traffic step(s) from "
                + ", ".join(Path(s).name for s in self.sources)]
        if self.empty:
            head.append("# nothing to learn: "
                        + ("no step missed" if not self.misses else
                           "every missed step's shapes are already in the plan"))
            return "\n".join(head) + "\n"
        head.append(f"# merge into {self.plan_file}: the phase below goes at the end of "
                    "`phases:`" + (", the variants under `sampling_variants:`"
                                   if self.sampling_variants else ""))
        body: dict[str, Any] = {}
        if self.sampling_variants:
            body["sampling_variants"] = {k: dict(v) for k, v in self.sampling_variants.items()}
        body["phases"] = [self.phase_mapping()]
        return "\n".join(head) + "\n" + dump_yaml(body)

    def phase_mapping(self) -> dict[str, Any]:
        return {"name": self.phase, "shapes": [dict(s) for s in self.shapes]}

    def diff(self) -> str:
        """A unified diff from the plan to the merged plan."""
        name = Path(self.plan_file).name
        return "".join(difflib.unified_diff(self.original_text.splitlines(keepends=True),
                                            self.merged_text.splitlines(keepends=True),
                                            fromfile=f"a/{name}", tofile=f"b/{name}"))

    def summary(self) -> str:
        events = sum(m.events for m in self.misses)
        lines = [f"learn: {events} post-ready compile event(s) in {len(self.misses)} step(s); "
                 f"{len(self.shapes)} new class(es) in phase '{self.phase}'"
                 + (f", {len(self.sampling_variants)} new sampling variant(s)"
                    if self.sampling_variants else "")
                 + (f"; +{self.added_requests} warm-up requests on the audited server"
                    if self.shapes else "")]
        lines += [f"  already in the plan: {c}" for c in self.covered]
        lines += [f"  unexplained: {u}" for u in self.unexplained]
        lines += [f"  left out by the merged plan's expansion: {s}" for s in self.skipped]
        if self.unattributed:
            lines.append(f"  {self.unattributed} compile event(s) during the audits had no "
                         "traffic step: learn cannot derive shapes for them")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "plan": self.plan_file, "phase": self.phase,
                "misses": [m.to_json() for m in self.misses],
                "shapes": [dict(s) for s in self.shapes],
                "sampling_variants": {k: dict(v) for k, v in self.sampling_variants.items()},
                "covered": list(self.covered), "unexplained": list(self.unexplained),
                "skipped": list(self.skipped), "unattributed": self.unattributed,
                "added_requests": self.added_requests, "notes": list(self.notes)}


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------

def find_audits(source: str | os.PathLike[str]) -> list[audit_file.AuditFile]:
    """The audit files of ``source``: one ``audit-*.json`` file, or every one in a directory
    (a state directory), oldest first."""
    p = Path(source)
    if p.is_dir():
        files = sorted(p.glob("audit-*.json"))
        if not files:
            hint = ("run `sglang-warmup audit --url URL --traffic FILE --state-dir "
                    f"{p}` first; learn needs the steps that caused the misses")
            if compile_log.files(p):
                raise WarmupError(f"{p}: a compile log but no audit-*.json", hint=hint)
            raise WarmupError(f"{p}: no audit-*.json", hint=hint)
        return [audit_file.read(f) for f in files]
    if not p.exists():
        raise WarmupError(f"{p}: no such file or directory",
                          hint="pass an audit-*.json or the state directory holding them")
    if p.suffix == ".jsonl" or p.name.startswith("compiles-"):
        raise WarmupError(f"{p}: a compile log holds no traffic shapes",
                          hint="pass the audit-*.json written by `sglang-warmup audit` (or its "
                               "directory); it attributes each miss to a traffic step")
    return [audit_file.read(p)]


def misses_of(audits: Sequence[audit_file.AuditFile]) -> tuple[list[Miss], int]:
    """Every step with misses (either pass), and the unattributed compile events."""
    out: list[Miss] = []
    unattributed = 0
    for a in audits:
        unattributed += sum(int(k.get("compiled", 0)) + int(k.get("disk_hits", 0))
                            + int(k.get("failed", 0)) for k in a.data.get("unattributed") or ())
        unattributed += int(a.data.get("unseen_events") or 0)
        for s in a.steps:
            p1, p2 = s.get("pass1") or {}, s.get("pass2") or {}
            events = int(p1.get("misses") or 0) + int(p2.get("misses") or 0)
            if not events:
                continue
            prefix = s.get("prefix") or {}
            kernels = tuple(dict.fromkeys(str(k.get("name")) for k in
                                          (p1.get("keys") or []) + (p2.get("keys") or [])))
            try:
                out.append(Miss(audit=a.path, index=int(s["index"]), label=str(s.get("label") or ""),
                                kind=str(s["kind"]), prompts=tuple(int(n) for n in s["prompts"]),
                                prefix_len=int(prefix.get("len") or 0),
                                prefix_cached=bool(s.get("prefix_cached")),
                                sampling=tuple(sorted((s.get("sampling") or {}).items())),
                                max_new_tokens=int(s.get("max_new_tokens") or 16),
                                events=events, kernels=kernels))
            except (KeyError, TypeError, ValueError) as exc:
                raise WarmupError(f"{a.path}: step {s.get('index')}: malformed ({exc})",
                                  hint="re-run `sglang-warmup audit`") from None
    return out, unattributed


# --------------------------------------------------------------------------------------------
# what the plan already sends
# --------------------------------------------------------------------------------------------

class _PlanIndex:
    """The request shapes of a plan's expansion, by what a learned item would produce."""

    def __init__(self, exp: Expansion) -> None:
        self.extend: dict[int, str] = {}
        self.prefix: dict[tuple[int, int], str] = {}
        self.concurrent: dict[tuple[int, ...], str] = {}
        self.batch: dict[tuple[int, ...], str] = {}
        self.sampling: dict[tuple, str] = {}
        hits = exp.prefix_hits()
        for s in exp.steps:
            reqs = s.requests
            for r in reqs:
                self.sampling.setdefault(r.sampling_params, s.shape_class)
            if s.mode == "single" and reqs:
                r, hit = reqs[0], hits.get((s.index, 0))
                if hit is not None:  # what the server computes: the prompt past its hit
                    self.prefix.setdefault((hit.tokens, r.input_len), s.shape_class)
                else:
                    self.extend.setdefault(r.input_len, s.shape_class)
            elif s.mode == "concurrent" and not any(r.prefix_key for r in reqs):
                self.concurrent.setdefault(tuple(sorted(r.input_len for r in reqs)), s.shape_class)
            elif s.mode == "batch":
                self.batch.setdefault(tuple(r.input_len for r in reqs), s.shape_class)


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------

class _Collector:
    """Learned items, de-duplicated, each with the steps that asked for it."""

    def __init__(self) -> None:
        self.extend: dict[int, list[Miss]] = {}
        self.chunked: dict[int, list[Miss]] = {}
        self.prefix: dict[int, dict[int, list[Miss]]] = {}
        self.concurrent: dict[tuple[int, ...], list[Miss]] = {}
        self.batch: dict[int, dict[tuple[int, str], list[Miss]]] = {}
        self.sampling: dict[tuple, dict[str, Any]] = {}

    @staticmethod
    def add(d: dict, key: Any, m: Miss) -> None:
        d.setdefault(key, [])
        if m not in d[key]:
            d[key].append(m)


class _Learner:
    """What each missed step asks for: items the plan already sends (``covered``), items to
    learn (into the collector), or nothing new (``unexplained``); one method per step kind."""

    def __init__(self, facts: ServerFacts, index: "_PlanIndex", notes: list[str]) -> None:
        self.facts, self.index, self.notes = facts, index, notes
        self.page = max(1, facts.page_size)
        self.chunk = facts.chunked_prefill_size
        self.cap = facts.max_running_requests or None
        self.col = _Collector()
        self.covered: list[str] = []
        self.unexplained: list[str] = []

    def miss(self, m: Miss) -> None:
        """Learn one missed step."""
        hit = (m.prefix_len // self.page) * self.page \
            if (m.prefix_cached and self.facts.radix_cache) else 0
        kind = "single" if len(m.prompts) == 1 else m.kind
        if kind == "single":
            new = self.extend(m, m.prompts[0], hit)
        elif kind == "burst":
            new = self.burst(m, hit)
        else:
            new = self.batch(m)
        new += self.sampling(m, kind)
        if not new:
            self.unexplained.append(
                f"{m.name}: {m.events} compile event(s) "
                f"({', '.join(m.kernels) or 'no kernel names: metrics mode'}); the plan already "
                "sends every shape of this step: if the audited server was warmed with this "
                "plan, what compiled depends on something plan format v1 cannot express")

    def extend(self, m: Miss, n: int, hit: int) -> int:
        """A prompt of ``n`` tokens (a prefix hit on ``hit`` cached tokens when there are
        some); how many new items it added."""
        index, col = self.index, self.col
        if hit and n > hit:
            if (hit, n) in index.prefix:
                self.covered.append(f"{m.name}: prefix hit {hit} + {n - hit} in class "
                                    f"{index.prefix[(hit, n)]}")
                return 0
            col.add(col.prefix.setdefault(hit, {}), n - hit, m)
            return 1
        if n in index.extend:
            self.covered.append(f"{m.name}: a {n}-token prompt in class {index.extend[n]}")
            return 0
        col.add(col.chunked if self.chunk and n > self.chunk else col.extend, n, m)
        return 1

    def burst(self, m: Miss, hit: int) -> int:
        """Concurrent prompts: groups of what each request computes, at most the request cap
        at once, and the prefix hits when the prefix was cached."""
        computed = [n - hit if hit and n > hit else n for n in m.prompts]
        size = self.cap if self.cap else len(computed)
        new = 0
        for start in range(0, len(computed), size):
            group = tuple(sorted(computed[start:start + size]))
            if group in self.index.concurrent:
                self.covered.append(f"{m.name}: {len(group)} concurrent prompts "
                                    f"{'+'.join(map(str, group))} in class "
                                    f"{self.index.concurrent[group]}")
            else:
                self.col.add(self.col.concurrent, group, m)
                new += 1
        if hit:
            new += sum(self.extend(m, n, hit) for n in m.prompts)
        return new

    def batch(self, m: Miss) -> int:
        """A batched request: the same size (at most the request cap), the mean prompt length
        (within the one-forward budget) and the same total-token class."""
        bs, total = len(m.prompts), sum(m.prompts)
        per = max(2, round(total / bs))
        if self.cap and bs > self.cap:  # the scheduler admits at most `cap` of them at once
            self.notes.append(f"{m.name}: a batch of {bs} is above max_running_requests "
                              f"({self.cap}); learned as batches of {self.cap}")
            total, bs = per * self.cap, self.cap
        cls = "aligned" if total % 16 == 0 else "odd"
        budget, page = self.facts.prefill_budget, max(self.facts.page_size or 1, 1)
        if budget is not None and bs * page > budget:  # whole pages: no more fit one prefill
            held = max(budget // page, 1)
            self.notes.append(f"{m.name}: a batch of {bs} is above what one prefill holds "
                              f"({held} requests of whole {page}-token pages in {budget}); "
                              f"learned as batches of {held}")
            bs = held
        if budget is not None and over_budget(batch_lengths(bs, per, cls), budget, page):
            asked, per = per, min(per, max(2, budget // bs - 1))
            # as the scheduler counts it: each request in whole pages (expand skips the rest)
            while per > 2 and over_budget(batch_lengths(bs, per, cls), budget, page):
                per -= 1
            self.notes.append(f"{m.name}: a batch of {bs} x {asked} tokens is above the "
                              f"one-forward budget ({budget}, in whole pages of {page}); "
                              f"learned with {per} per request")
        lengths = tuple(batch_lengths(bs, per, cls))
        if lengths in self.index.batch:
            self.covered.append(f"{m.name}: a batch of {bs} x {per} ({cls}) in class "
                                f"{self.index.batch[lengths]}")
            return 0
        self.col.add(self.col.batch.setdefault(per, {}), (bs, cls), m)
        return 1

    def sampling(self, m: Miss, kind: str) -> int:
        """The step's sampling parameters, unless the plan already sends them."""
        if not m.sampling or m.sampling in self.index.sampling:
            return 0
        entry = self.col.sampling.setdefault(m.sampling, {"steps": [], "concurrency": set(),
                                                          "prompt": [], "decode": []})
        if m not in entry["steps"]:
            entry["steps"].append(m)
        conc = len(m.prompts) if kind != "single" else 1
        entry["concurrency"].add(min(conc, self.cap) if self.cap else conc)
        entry["prompt"].append(min(m.prompts))
        entry["decode"].append(m.max_new_tokens)
        return 1


def _facts(audits: Sequence[Any], notes: list[str]) -> ServerFacts:
    """The first audit's facts; a note for each audit of a server with other settings."""
    facts = audits[0].facts
    for a in audits[1:]:
        other = a.facts
        if (other.page_size, other.chunked_prefill_size, other.max_running_requests) != \
                (facts.page_size, facts.chunked_prefill_size, facts.max_running_requests):
            notes.append(f"{Path(a.path).name} was audited on a server with other settings than "
                         f"{Path(audits[0].path).name}; sizes follow the first")
    return facts


def learn(source: str | os.PathLike[str], plan_path: str | os.PathLike[str], *,
          phase: str = "learned") -> Learned:
    """Learn plan classes from the audit file(s) of ``source`` for the plan at ``plan_path``:
    read, learn each miss, write the stanzas into the plan's text, check the merged plan."""
    audits = find_audits(source)
    notes: list[str] = []
    facts = _facts(audits, notes)
    raw, plan_file = loader.read(plan_path)
    plan = loader.loads(raw, plan_file)
    original = raw.decode("utf-8")  # loads checked that it is UTF-8
    misses, unattributed = misses_of(audits)
    learner = _Learner(facts, _PlanIndex(expand(plan, facts)), notes)
    for m in misses:
        learner.miss(m)
    shapes, variants = _stanzas(learner.col, plan, facts)
    merged, phase_name, skipped, added = original, phase, [], 0
    if shapes:
        merged = merge_text(original, {"name": _unique(phase, {p.name for p in plan.phases}),
                                       "shapes": shapes}, variants, where=str(plan_path))
        merged_plan, merged_exp = _validate(merged, str(plan_path), facts)
        phase_name = merged_plan.phases[-1].name
        learned_classes = {s["class"] for s in shapes}
        skipped = [f"{k.shape_class}{' ' + k.item if k.item else ''}: {k.reason}"
                   for k in merged_exp.skipped if k.shape_class in learned_classes]
        added = sum(s.num_requests for s in merged_exp.steps if s.shape_class in learned_classes)
    return Learned(sources=tuple(a.path for a in audits), plan_file=str(plan_path),
                   phase=phase_name, misses=tuple(misses), shapes=tuple(shapes),
                   sampling_variants=variants, covered=tuple(dict.fromkeys(learner.covered)),
                   unexplained=tuple(learner.unexplained), skipped=tuple(skipped),
                   unattributed=unattributed, original_text=original, merged_text=merged,
                   notes=tuple(dict.fromkeys(notes)), added_requests=added)


def _why(what: str, ms: Sequence[Miss]) -> str:
    names = [f"{m.index} ({m.label or m.kind})" for m in ms]
    steps = ", ".join(names[:_WHY_STEPS]) + (f" and {len(names) - _WHY_STEPS} more"
                                             if len(names) > _WHY_STEPS else "")
    sources = ", ".join(dict.fromkeys(Path(m.audit).name for m in ms))
    return f"{what}, compiled after ready at step(s) {steps} of {sources}"


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    i = 2
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


def _stanzas(col: _Collector, plan: Plan, facts: ServerFacts) -> tuple[list[dict], dict]:
    taken = {s.name for s in plan.shapes}
    shapes: list[dict] = []

    def add(name: str, body: dict) -> None:
        cls = _unique(name, taken)
        taken.add(cls)
        shapes.append({"class": cls, **body})

    def all_of(groups: Mapping[Any, list[Miss]]) -> list[Miss]:
        seen: list[Miss] = []
        for ms in groups.values():
            seen += [m for m in ms if m not in seen]
        return seen

    if col.extend:
        add("learned_extends", {"kind": "extend",
                                "why": _why("learned prompt lengths",
                                            all_of(col.extend)),
                                "lengths": sorted(col.extend)})
    if col.chunked:
        add("learned_chunked", {"kind": "chunked", "requires": ["chunked_prefill"],
                                "why": _why("learned chunked prompt lengths",
                                            all_of(col.chunked)),
                                "lengths": sorted(col.chunked)})
    for base in sorted(col.prefix):
        ext = col.prefix[base]
        add(f"learned_prefix_{base}", {"kind": "prefix", "requires": ["radix_cache"],
                                       "why": _why(f"learned extends on a cached {base}-token "
                                                   "prefix",
                                                   all_of(ext)),
                                       "base": base, "extends": sorted(ext)})
    if col.concurrent:
        add("learned_concurrent", {"kind": "concurrent",
                                   "why": _why("learned concurrent prompts (the tokens each "
                                               "request computes)",
                                               all_of(col.concurrent)),
                                   "groups": [list(g) for g in col.concurrent]})
    for per in sorted(col.batch):
        items = col.batch[per]
        classes = [c for c in ("aligned", "odd") if any(k[1] == c for k in items)]
        add(f"learned_batch_{per}", {"kind": "batch",
                                     "why": _why(f"learned batches of about {per} tokens a "
                                                 "request",
                                                 all_of(items)),
                                     "batch_sizes": sorted({k[0] for k in items}),
                                     "tokens_per_request": per, "token_classes": classes})
    variants: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    steps: list[Miss] = []
    prompts: list[int] = []
    decode: list[int] = []
    conc: set[int] = set()
    known = {**SAMPLING_VARIANTS, **{k: dict(v) for k, v in plan.sampling_variants.items()}}
    taken_variants = set(known)
    for params, entry in col.sampling.items():
        as_dict = dict(params)
        name = next((k for k, v in known.items() if dict(v) == as_dict), None)
        if name is None:
            bad = [k for k, v in as_dict.items() if k not in SAMPLING_KEYS
                   or isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0]
            if bad:
                continue  # not expressible as a plan variant (checked at audit load too)
            name = _unique("learned_" + "_".join(k for k, _ in params), taken_variants)
            taken_variants.add(name)
            variants[name] = as_dict
            known[name] = as_dict
        if name not in names:
            names.append(name)
        steps += [m for m in entry["steps"] if m not in steps]
        prompts += entry["prompt"]
        decode += entry["decode"]
        conc |= entry["concurrency"]
    if names:
        add("learned_sampling", {"kind": "sampling",
                                 "why": _why("learned sampling parameters", steps),
                                 "variants": names, "prompt": min(prompts),
                                 "decode_tokens": max(2, min(16, min(decode))),
                                 "concurrency": sorted(conc)})
    return shapes, variants


def _validate(text: str, where: str, facts: ServerFacts) -> tuple[Plan, Expansion]:
    try:
        plan = loader.loads(text, where)
    except PlanError as exc:  # a bug here, not the user's: say what the loader said
        raise WarmupError(f"the merged plan does not load: {exc.message}",
                          hint="report this; the learned YAML is printed without --write") from None
    try:
        exp = expand(plan, facts, over_limit="fail")  # every learned class must run
    except PlanError as exc:
        raise WarmupError(f"the merged plan does not expand on the audited server: {exc.message}",
                          hint=exc.hint or "shrink the learned classes") from None
    return plan, exp


# --------------------------------------------------------------------------------------------
# YAML text
# --------------------------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML has no type hints here: Any
    """Block style with indented sequences (``key:\\n  - item``), as the shipped plans."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)


def dump_yaml(data: Any) -> str:
    """Plan-style YAML: lists of scalars in flow style, mappings in block style, keys in the
    order given."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                     width=1 << 16, allow_unicode=True)


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def merge_text(text: str, phase: Mapping[str, Any], variants: Mapping[str, Mapping[str, Any]], *,
               where: str = "<plan>") -> str:
    """The plan text with ``phase`` appended to its ``phases`` list and ``variants`` added to
    its ``sampling_variants`` (created if absent).  The rest of the text, comments included,
    is kept byte for byte."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        raise WarmupError(f"{where}: the plan is not a mapping", hint="check the plan file")
    top = {k.value: (k, v) for k, v in root.value}
    if "phases" not in top:
        raise WarmupError(f"{where}: the plan has no phases", hint="check the plan file")
    pkey, pnode = top["phases"]
    if not isinstance(pnode, yaml.SequenceNode) or pnode.flow_style or not pnode.value:
        raise WarmupError(f"{where}: phases is not a block list; learn cannot add to it",
                          hint="write phases as a block list (`- name: ...` lines), or merge "
                               "the printed YAML by hand")
    first = pnode.value[0]
    line = text.splitlines()[first.start_mark.line]
    lead = line[:first.start_mark.column].rstrip()
    if not lead.endswith("-"):
        raise WarmupError(f"{where}:{first.start_mark.line + 1}: cannot find the list dash of "
                          "the first phase", hint="merge the printed YAML by hand")
    dash = len(lead) - 1
    inserts: list[tuple[int, str]] = []
    item = _indent(dump_yaml([dict(phase)]), dash)
    inserts.append(_at_line_start(text, pnode.end_mark.index, item))
    if variants:
        block = dump_yaml({k: dict(v) for k, v in variants.items()})
        if "sampling_variants" in top:
            _, vnode = top["sampling_variants"]
            if not isinstance(vnode, yaml.MappingNode) or vnode.flow_style or not vnode.value:
                raise WarmupError(f"{where}: sampling_variants is not a block mapping; learn "
                                  "cannot add to it", hint="merge the printed YAML by hand")
            col = vnode.value[0][0].start_mark.column
            inserts.append(_at_line_start(text, vnode.end_mark.index, _indent(block, col)))
        else:
            start = pkey.start_mark.index - pkey.start_mark.column
            inserts.append((start, "sampling_variants:\n" + _indent(block, 2)))
    out = text
    for pos, chunk in sorted(inserts, key=lambda x: x[0], reverse=True):
        out = out[:pos] + chunk + out[pos:]
    return out


def _at_line_start(text: str, pos: int, chunk: str) -> tuple[int, str]:
    """Insert ``chunk`` (whole lines) at ``pos``, which YAML puts at the start of the line
    after a block; at the end of a file without a final newline, start a line first."""
    if pos >= len(text):
        return (len(text), chunk if text.endswith("\n") else "\n" + chunk)
    if pos > 0 and text[pos - 1] != "\n":
        return (pos, "\n" + chunk)
    return (pos, chunk)


def write_plan(text: str, path: str | os.PathLike[str]) -> None:
    """Write the merged plan atomically."""
    p = Path(path)
    try:
        atomic.write_text(p, text)
    except OSError as exc:
        raise WarmupError(f"cannot write {p}: {exc.strerror or exc}",
                          hint="pass a writable --write path") from None
