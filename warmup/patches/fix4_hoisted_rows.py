"""Fix 4: under decoder-SWA bounded replay, the eager ratio-1/2 break takes the leading rows of
the hoisted request indices and positions (PR #44627).

With ``--enable-decoder-swa-bounded-replay`` the late layers run on a padded tail block whose
hoisted rows (``low_ratio_req_indices`` / ``low_ratio_pos_i64``) have the block size, real
rows first.  Once fix 1 keeps the ratio-1/2 sources eager, the break inside the tail sees only
the block's real rows, the equality test in ``forward_low_ratio_sources`` fails, and the
fallback expands the whole extend's ``extend_seq_lens`` into those rows: capture fails with
"repeat_interleave: the output_size argument (128) must be the same as the sum of the elements
in the repeats tensor (8192)".  The wrapper hands the original the leading ``n`` hoisted rows
while the tail is active, so its own equality test passes; nothing changes without the tail.
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any

from warmup.patches import fix1_low_ratio_window as fix1
from warmup.patches.source import MARK, FileView, LiveView, clone, source_hash
from warmup.patches.status import Detection, Refused

NUMBER = 4
NAME = "tail-hoisted-rows"
SUMMARY = ("under decoder-SWA bounded replay, take the leading hoisted rows in the eager "
           "ratio-1/2 break")
MODULE = fix1.MODULE
CLASS = fix1.CLASS
ATTR = "forward_low_ratio_sources"
TARGET = f"{MODULE}:{CLASS}.{ATTR}"

_METHOD = f"{CLASS}.{ATTR}"
BUGGY = {_METHOD: "b4f8a30ceeaf7d3c"}  # 0.5.22
FIXED = {_METHOD: "be85989f668986fe"}  # 0.5.23: n = min(hoisted, positions), any caller
METADATA_CLASS = "DSV4Metadata"
EQUALITY = "hoisted_pos.shape[0] == positions.shape[0]"
UPSTREAM_FORM = "min(hoisted_pos.shape[0]"


def detect(view: LiveView | FileView, ctx: Any = None) -> Detection:
    text = view.source(_METHOD)
    digest = source_hash(text)
    if UPSTREAM_FORM in text or EQUALITY not in text:
        match = "exact" if digest == FIXED[_METHOD] else "structural"
        return Detection(False, match,
                         f"{ATTR} already truncates to the hoisted rows (or never compares them)")
    if "late_layer_tail" not in view.fields(METADATA_CLASS):
        return Detection(False, "structural",
                         f"{METADATA_CLASS} has no late_layer_tail: no prefill-graph tail here")
    return Detection(True, "exact" if digest == BUGGY[_METHOD] else "structural",
                     "inside the late-layer tail the eager break falls back to the whole "
                     "extend's lengths")


def build(module: ModuleType, original: Any, ctx: Any) -> Any:
    if not callable(original) or isinstance(original, (property, staticmethod, classmethod)):
        raise Refused(f"{CLASS}.{ATTR} is not a plain method")
    orig = original

    @functools.wraps(orig)
    def forward_low_ratio_sources(self, *args, **kwargs):
        meta = getattr(self, "forward_metadata", None)
        positions = kwargs.get("positions")
        req = getattr(meta, "low_ratio_req_indices", None)
        pos = getattr(meta, "low_ratio_pos_i64", None)
        if (
            meta is None
            or getattr(meta, "late_layer_tail", None) is None
            or req is None
            or pos is None
            or positions is None
            or pos.shape[0] <= positions.shape[0]
        ):
            return orig(self, *args, **kwargs)
        rows = positions.shape[0]
        # The tail builder lists the real rows first; views, so capture-safe.
        meta.low_ratio_req_indices, meta.low_ratio_pos_i64 = req[:rows], pos[:rows]
        try:
            return orig(self, *args, **kwargs)
        finally:
            meta.low_ratio_req_indices, meta.low_ratio_pos_i64 = req, pos

    setattr(forward_low_ratio_sources, MARK, NUMBER)
    return forward_low_ratio_sources


def verify(module: ModuleType, installed: Any, original: Any) -> str:
    """Run the installed wrapper over a recording stand-in for the original."""
    import torch

    if getattr(installed, MARK, None) != NUMBER or installed.__wrapped__ is not original:
        raise AssertionError(f"{CLASS}.{ATTR} is not the fix-4 wrapper over the original")
    seen: list[tuple[int, int]] = []

    def record(self, **kwargs):
        meta = self.forward_metadata
        seen.append((meta.low_ratio_req_indices.shape[0], meta.low_ratio_pos_i64.shape[0]))

    block, live = 8, 3
    meta = SimpleNamespace(low_ratio_req_indices=torch.zeros(block, dtype=torch.int64),
                           low_ratio_pos_i64=torch.arange(block), late_layer_tail=object())
    backend = SimpleNamespace(forward_metadata=meta)
    probe = clone(installed, closure={"orig": record})
    probe(backend, positions=torch.arange(live))
    meta.late_layer_tail = None
    probe(backend, positions=torch.arange(live))
    restored = (meta.low_ratio_req_indices.shape[0], meta.low_ratio_pos_i64.shape[0])
    if seen != [(live, live), (block, block)] or restored != (block, block):
        raise AssertionError(f"probe saw {seen}, restored {restored}")
    return (f"verified: inside the tail {block} hoisted rows reach the break as {live}; "
            "outside it nothing changes")
