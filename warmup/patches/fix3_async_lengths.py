"""Fix 3: ``SparsePrefillChunkCache.ensure_compressed`` uploads its per-request lengths with
``async_h2d`` instead of a pageable copy (PR #44627).

The method runs in the attention eager break of the breakable prefill graph, where the host
has run ahead of the GPU.  ``torch.tensor(list, device=cuda)`` is a pageable host-to-device
copy that synchronizes with the stream, so each break waited for every queued graph segment
(63 ms of host blocking per 8K-token step in the PR's trace).  The buggy call sits in the
middle of the method, so this fix is a guarded source rewrite of exactly that one line; the
gather is unchanged.  A pure performance fix, independent of fixes 1, 2, 4 and 5.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from warmup.patches.source import (
    MARK, FileView, LiveView, TargetMissing, guarded_rewrite, source_hash,
)
from warmup.patches.status import Detection, Refused

NUMBER = 3
NAME = "async-lengths-upload"
SUMMARY = "upload ensure_compressed's lengths with async_h2d instead of a pageable copy"
MODULE = "sglang.srt.layers.attention.dsv4.sparse_prefill_utils"
CLASS = "SparsePrefillChunkCache"
ATTR = "ensure_compressed"
TARGET = f"{MODULE}:{CLASS}.{ATTR}"

_METHOD = f"{CLASS}.{ATTR}"
BUGGY = {_METHOD: "0d2a1c90fc09d4d6"}  # 0.5.22
FIXED = {_METHOD: "e4627ac7a45fa14a"}  # 0.5.23 imports async_h2d and uses it
HELPER_MODULE = "sglang.srt.utils.common"
HELPER = "async_h2d"
INJECTED = "__sglang_warmup_async_h2d__"
OLD = "lengths = torch.tensor(lengths_cpu, dtype=torch.int32, device=device)"
NEW = f"lengths = {INJECTED}(lengths_cpu, dtype=torch.int32, device=device)"


def _helper_available(view: LiveView | FileView) -> bool:
    if isinstance(view, FileView):
        try:
            return FileView.of(HELPER_MODULE).has(HELPER)
        except (TargetMissing, OSError, SyntaxError):
            return False
    try:
        return callable(getattr(importlib.import_module(HELPER_MODULE), HELPER, None))
    except ImportError:
        return False


def detect(view: LiveView | FileView, ctx: Any = None) -> Detection:
    text = view.source(_METHOD)
    digest = source_hash(text)
    count = text.count(OLD)
    if count == 0:
        match = "exact" if digest == FIXED[_METHOD] else "structural"
        return Detection(False, match, f"{ATTR} has no pageable torch.tensor(lengths_cpu, ...) upload")
    reason = "ensure_compressed uploads its lengths with a pageable copy that waits for the graph"
    if not _helper_available(view):
        reason += f"; {HELPER_MODULE}.{HELPER} is missing, so the fix cannot apply"
    return Detection(True, "exact" if digest == BUGGY[_METHOD] else "structural", reason)


def build(module: ModuleType, original: Any, ctx: Any) -> Any:
    helper = getattr(importlib.import_module(HELPER_MODULE), HELPER, None)
    if not callable(helper):
        raise Refused(f"{HELPER_MODULE}.{HELPER} is missing in the installed SGLang")
    if not callable(original) or not hasattr(original, "__code__"):
        raise Refused(f"{CLASS}.{ATTR} is not a plain method")
    if OLD not in LiveView(module).source(_METHOD):
        raise Refused(f"{CLASS}.{ATTR} has no pageable torch.tensor(lengths_cpu, ...) upload "
                      "to rewrite")
    return guarded_rewrite(original, what=f"{CLASS}.{ATTR}", old=OLD, new=NEW,
                           inject={INJECTED: helper}, fix=NUMBER)


def verify(module: ModuleType, installed: Any, original: Any) -> str:
    if getattr(installed, MARK, None) != NUMBER:
        raise AssertionError(f"{CLASS}.{ATTR} is not the fix-3 rewrite")
    again = detect(LiveView(module))
    if again.needed:
        raise AssertionError("the pageable upload is still in the installed method")
    text = LiveView(module).source(_METHOD)
    if text.count(NEW) != 1:
        raise AssertionError("the async_h2d upload is not in the installed method")
    return "verified: detect again finds the async_h2d upload and no pageable copy"
