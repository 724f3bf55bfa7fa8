"""Fix 2: the fused low-ratio compressor uses the live rows of ``raw_out_loc`` /
``c1_out_loc`` / ``c2_out_loc`` (PR #44627).

When fix 1 keeps the ratio-1/2 sources in their eager break, the break passes the live rows
(``x``, ``pos``: e.g. 219) while the forward metadata was built for the replayed bucket (e.g.
256).  ``_low_ratio_compress_fused`` hands the bucket-sized locations to the c1/c2 JIT kernels,
which reject the mismatch ("Tensor match failed ... expected 219 but got 256").  The wrapper
swaps in views of the leading ``pos.shape[0]`` rows for the call and restores the attributes
afterwards; padding rows sit at the tail, and callers that pass equal lengths see a no-op.
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any

from warmup.patches import fix1_low_ratio_window as fix1
from warmup.patches.source import MARK, FileView, LiveView, clone, source_hash
from warmup.patches.status import Detection, Refused

NUMBER = 2
NAME = "fused-compressor-live-rows"
SUMMARY = "slice the fused low-ratio compressor's raw/c1/c2 out_loc to the live rows"
MODULE = fix1.MODULE
CLASS = fix1.CLASS
ATTR = "_low_ratio_compress_fused"
TARGET = f"{MODULE}:{CLASS}.{ATTR}"

_METHOD = f"{CLASS}.{ATTR}"
BUGGY = {_METHOD: "ab129fd23fe80eef"}  # 0.5.22
FIXED = {_METHOD: "76ec488889e6ec44"}  # 0.5.23: unsliced, mismatch avoided by construction
#: The per-token location tensors of ``DSV4AttnMetadata`` the kernels check against ``pos``.
LOC_FIELDS = ("raw_out_loc", "c1_out_loc", "c2_out_loc")


def detect(view: LiveView | FileView, ctx: Any = None) -> Detection:
    """Unsliced ``core.raw_out_loc,`` in the fused compressor, reachable only with fix 1."""
    text = view.source(_METHOD)
    exact = source_hash(text) == BUGGY[_METHOD]
    if "core.raw_out_loc," not in text or "raw_out_loc[:" in text:
        return Detection(False, "structural",
                         f"{ATTR} does not pass an unsliced core.raw_out_loc to its kernels")
    fix1_needed = fix1.detect(view, ctx).needed
    fix1_forced = ctx is not None and ctx.mode(fix1.NUMBER) == "on"
    if not (fix1_needed or fix1_forced):
        match = "exact" if source_hash(text) == FIXED[_METHOD] else "structural"
        return Detection(False, match,
                         "the eager break never pairs live rows with bucket-sized metadata "
                         "here (fix 1 is not needed)")
    return Detection(True, "exact" if exact else "structural",
                     "the eager ratio-1/2 break passes live rows against bucket-sized "
                     "out_loc metadata")


def build(module: ModuleType, original: Any, ctx: Any) -> Any:
    if not callable(original) or isinstance(original, (property, staticmethod, classmethod)):
        raise Refused(f"{CLASS}.{ATTR} is not a plain method")
    orig = original

    @functools.wraps(orig)
    def _low_ratio_compress_fused(self, layer, x, req, pos, *args, **kwargs):
        swapped: list[tuple[str, Any]] = []
        core = None
        try:
            core = self.forward_metadata.core_metadata
            rows = pos.shape[0]
            for name in LOC_FIELDS:
                loc = getattr(core, name, None)
                if loc is not None and loc.shape[0] > rows:
                    swapped.append((name, loc))
                    setattr(core, name, loc[:rows])  # a view: host-side only, capture-safe
        except Exception:  # noqa: BLE001 - unusual metadata: leave it to the original
            for name, loc in swapped:
                setattr(core, name, loc)
            swapped = []
        try:
            return orig(self, layer, x, req, pos, *args, **kwargs)
        finally:
            for name, loc in swapped:
                setattr(core, name, loc)

    setattr(_low_ratio_compress_fused, MARK, NUMBER)
    return _low_ratio_compress_fused


def verify(module: ModuleType, installed: Any, original: Any) -> str:
    """Run the installed wrapper over a recording stand-in for the original."""
    import torch

    if getattr(installed, MARK, None) != NUMBER or installed.__wrapped__ is not original:
        raise AssertionError(f"{CLASS}.{ATTR} is not the fix-2 wrapper over the original")
    seen: dict[str, int] = {}

    def record(self, layer, x, req, pos, *args, **kwargs):
        core = self.forward_metadata.core_metadata
        seen.update({name: getattr(core, name).shape[0] for name in LOC_FIELDS})

    bucket, live = 4, 3
    core = SimpleNamespace(**{name: torch.zeros(bucket, dtype=torch.int64) for name in LOC_FIELDS})
    backend = SimpleNamespace(forward_metadata=SimpleNamespace(core_metadata=core))
    clone(installed, closure={"orig": record})(backend, None, None, None, torch.zeros(live))
    restored = {name: getattr(core, name).shape[0] for name in LOC_FIELDS}
    if set(seen.values()) != {live} or set(restored.values()) != {bucket}:
        raise AssertionError(f"probe saw {seen}, restored {restored}")
    return f"verified: {bucket}-row metadata reaches the kernels as {live} live rows, then restored"

