"""Learn a steps record (:mod:`warmup.plan.step_record`) from the two passes of the second-pass
check: which steps of the first pass paid a first-time cost.

A step is *loud* when the first pass stamped a compile-log record with it (a compile, a disk
hit, a library build, a ``torch.compile`` trace, a first use: whatever the SGLang processes
recorded while it was in flight), when it failed or was not replayed, or when its first send
took both ``ratio`` times and ``min_ms`` more than its send in the second pass (a first-time
cost no library records: cuBLAS loading a kernel, the caching allocator growing, a lazy
buffer).  A step that hits a prefix is loud too when its replay took ``ratio`` times and
``min_ms`` more than its first send (the replay met a colder cache: its timing tells nothing).
Every other step is quiet.  The steps that put in the cache what a loud step hits are kept with
it (:func:`warmup.plan.step_record.prefix_closure`).  Learned only from a first pass that sent
every step of the expansion.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from cache_tools.compile_log import ALLOCATOR, GEMM_SWEEP, is_kept_miss
from warmup.plan.step_record import (StepEvidence, StepRecord, gemm_rows, prefix_closure,
                                     slower)

if TYPE_CHECKING:
    from warmup.plan.model import Expansion
    from warmup.serve.report import RunReport

#: A step is loud when its first send took RATIO times its replay and MIN_MS more: stricter
#: than the 1.5x a first request may take against its repeat, so a cost the timing misses
#: stays well under it.
RATIO = 1.2
MIN_MS = 5.0


def learn(exp: Expansion, first: RunReport, records: Iterable[Mapping], replay: RunReport, *,
          ratio: float = RATIO, min_ms: float = MIN_MS, device: str = "",
          baked: Iterable[Mapping] | None = None) -> StepRecord:
    """The record of ``exp`` from its first pass (``first``: the report, ``records``: the
    compile-log records written while it ran) and the second (``replay``).  ``baked``: the
    compile-log records of the start that baked the caches, on the same expansion: a step that
    compiled there a kernel the caches keep counts as loud too.  Where steps batch by timing
    (concurrent prompts), this start may load such a kernel at another step first, and the
    step that compiled it in plan order, quiet here, would be left out; a launch whose
    concurrent prompts batch otherwise would then meet the kernel after ready.  (A library
    build seen in its cache directory is stamped with the step of the watcher's poll, which
    may be the next: that keeps one step too many, never one too few.)"""
    events: dict[int, int] = {}
    for index in _stamped(exp, records, lambda r: r.get("event") not in (GEMM_SWEEP, ALLOCATOR)):
        events[index] = events.get(index, 0) + 1
    counted = 0
    for index in _stamped(exp, baked or (), is_kept_miss):
        events[index] = events.get(index, 0) + 1
        counted += 1
    first_ms, replay_ms = dict(first.step_ms), dict(replay.step_ms)
    evidence = [StepEvidence(s.index, first_ms.get(s.index), replay_ms.get(s.index),
                             events.get(s.index, 0)) for s in exp.steps]
    keep = loud(evidence, ratio=ratio, min_ms=min_ms, hitting=hitting(exp))
    return StepRecord(plan=exp.plan, plan_sha256=exp.plan_sha256,
                      expansion_digest=exp.digest(), steps=len(exp.steps),
                      keep=tuple(sorted(prefix_closure(exp, keep))), ratio=ratio, min_ms=min_ms,
                      facts=exp.facts.to_dict(), device=device, learned_at=round(time.time(), 3),
                      evidence=tuple(evidence), server_args=dict(exp.server_args),
                      gemm=gemm_rows(first.gemm_sweeps),
                      baked=None if baked is None else counted)


def _stamped(exp: Expansion, records: Iterable[Mapping],
             which: Callable[[Mapping], bool]) -> Iterable[int]:
    """The step index of each warm-up record of ``exp``'s steps that ``which`` takes."""
    names = {s.index: s.shape_class for s in exp.steps}
    for r in records:
        index = r.get("request")
        if r.get("phase") == "warmup" and isinstance(index, int) \
                and names.get(index) == r.get("shape_class") and which(r):
            yield index


def loud(evidence: Iterable[StepEvidence], *, ratio: float = RATIO, min_ms: float = MIN_MS,
         hitting: Iterable[int] = ()) -> set[int]:
    """The loud steps of ``evidence`` (before the prefix closure).  A step that hits a prefix
    (``hitting``) is loud too when its replay ran ``ratio`` times and ``min_ms`` slower than its
    first send: the replay met a colder cache (its prefix gone), so the timing cannot tell."""
    hits = set(hitting)
    return {e.index for e in evidence
            if e.events or e.first_ms is None or e.replay_ms is None
            or slower(e.first_ms, e.replay_ms, ratio, min_ms)
            or (e.index in hits and slower(e.replay_ms, e.first_ms, ratio, min_ms))}


def hitting(exp: Expansion) -> set[int]:
    """The steps of ``exp`` with a request that hits a prefix an earlier step put in the cache."""
    return {index for index, _pos in exp.prefix_hits()}
