"""Fix 1: keep the ratio-1/2 sources eager when the prefill graph is wider than the candidate
window (PR #44627, ``_low_ratio_graph_fits_candidates``).

SGLang 0.5.22 captures the ratio-1/2 indexer with a full top-k over the prefill graph's whole
context width, which equals the candidate top-k only inside the candidate window
(``candidate_topk_blocks * candidate_block_size`` = 2,048 x 8 = 16,384 positions on
V4.1-Flash).  A wider graph fails at capture with "prefill graph indexer width N exceeds the
candidate window".  The fix adds a last conjunct to ``low_ratio_prefill_graph``: False when
the graph's width divided by the smallest low ratio exceeds the window, so those layers run in
their existing eager break with the candidate top-k, exactly as eager prefill does.
"""

from __future__ import annotations

import logging
from types import ModuleType, SimpleNamespace
from typing import Any

from warmup.patches.source import (
    MARK, FileView, LiveView, TargetMissing, call_quietly, clone, source_hash,
)
from warmup.patches.status import Detection, Refused

NUMBER = 1
NAME = "low-ratio-window"
SUMMARY = "keep ratio-1/2 sources eager when the prefill graph is wider than the candidate window"
MODULE = "sglang.srt.layers.attention.deepseek_v4_backend"
CLASS = "DeepseekV4AttnBackend"
ATTR = "low_ratio_prefill_graph"
TARGET = f"{MODULE}:{CLASS}.{ATTR}"

_PROPERTY = f"{CLASS}.{ATTR}"
_CAPTURED = f"{CLASS}._low_ratio_index_topk_captured"
#: Known sources (sha256 of the dedented source, 16 hex digits).
BUGGY = {_PROPERTY: "8f0fe1fa1c6ae47e", _CAPTURED: "56e4c0055a1cf715"}  # 0.5.22
FIXED = {_PROPERTY: "64ac912d0f16ab42", _CAPTURED: "cdc017f22bb2d4b0"}  # 0.5.23
#: Either helper means the backend already bounds the captured indexer: the PR's own helper,
#: or 0.5.23's any-context prefill graph (replay metadata at the live width).
UPSTREAM_HELPERS = ("_low_ratio_graph_fits_candidates", "_prefill_graph_context_width")
#: The PR's recipe width; the behavioural probe asks whether it still captures the indexer.
PROBE_WIDE = 262_144
PROBE_NARROW = 16_384
_WINDOW_CACHE = "_sglang_warmup_candidate_window"

logger = logging.getLogger("sglang_warmup.patches")


def _hashes_match(view: LiveView | FileView, table: dict[str, str]) -> bool:
    try:
        return all(source_hash(view.source(path)) == h for path, h in table.items())
    except TargetMissing:
        return False


def detect(view: LiveView | FileView, ctx: Any = None) -> Detection:
    """Structural checks of §A.1, plus the behavioural probe when the module is imported."""
    if view.kind(_PROPERTY) != "property":
        raise TargetMissing(f"{CLASS}.{ATTR} is not a property")
    getter = view.source(_PROPERTY)
    if _hashes_match(view, FIXED):
        return Detection(False, "exact", "the 0.5.23 any-context prefill graph is installed")
    for helper in UPSTREAM_HELPERS:
        if view.has(f"{CLASS}.{helper}"):
            return Detection(False, "structural",
                             f"{CLASS}.{helper} exists: the captured indexer is already bounded")
    if "has_dense_fp4_indexer" not in getter or "candidate" in getter:
        return Detection(False, "structural",
                         f"{ATTR} is not the unbounded fp4-indexer gate of 0.5.22")
    if not view.has(_CAPTURED) or "exceeds the candidate window" not in view.source(_CAPTURED):
        return Detection(False, "structural",
                         "the captured ratio-1/2 indexer has no candidate-window assert")
    match = "exact" if _hashes_match(view, BUGGY) else "structural"
    reason = "a prefill graph wider than the candidate window captures the full top-k indexer"
    if isinstance(view, LiveView):
        wide, error = call_quietly(lambda: _probe_original(view.member(_PROPERTY).fget))
        if error:
            reason += f" (behavioural probe not run: {error})"
        elif wide is False:
            return Detection(False, "structural",
                             f"{ATTR} already returns False for a {PROBE_WIDE:,}-token graph")
        else:
            reason += f"; probe: True for a {PROBE_WIDE:,}-token graph"
    return Detection(True, match, reason)


def requires(ctx: Any) -> str | None:
    """Fix 1 alone turns a capture failure into a first-request failure: it needs fix 2."""
    fix2 = ctx.status(2)
    if not fix2.active:
        return (f"fix 2 (fused compressor rows) is {fix2.verdict} ({fix2.reason}); "
                "fix 1 without it fails at the first prefill instead of at capture")
    return None


def _probe_overrides() -> dict[str, Any]:
    # What an SM100 GPU with DeepGEMM's fp4 indexer and no attention-CP would answer.
    return {
        "has_dense_fp4_indexer": lambda: True,
        "is_sm100_or_newer": lambda: True,
        "get_parallel": lambda: SimpleNamespace(attn_cp_size=1),
    }


def _probe_backend(window_blocks: int = 2048, block_size: int = 8) -> SimpleNamespace:
    config = SimpleNamespace(candidate_topk_blocks=window_blocks, candidate_block_size=block_size)
    return SimpleNamespace(
        low_ratios=(1, 2),
        enable_decoder_swa_bounded_replay=False,
        model_runner=SimpleNamespace(model_config=SimpleNamespace(hf_text_config=config)),
    )


def _probe_original(fget: Any) -> bool:
    """The original getter on an SM100-shaped probe (no host state touched)."""
    probe = clone(fget, globals_=_probe_overrides())
    return bool(probe(_probe_backend()))


def candidate_window(backend: Any) -> int:
    """``candidate_topk_blocks * candidate_block_size`` of the model, cached per instance."""
    cached = getattr(backend, "__dict__", {}).get(_WINDOW_CACHE)
    if cached is not None:
        return cached
    cfg = backend.model_runner.model_config.hf_text_config
    window = int(getattr(cfg, "candidate_topk_blocks", 0) or 0) * int(
        getattr(cfg, "candidate_block_size", 0) or 0)
    try:
        setattr(backend, _WINDOW_CACHE, window)
    except AttributeError:
        pass
    return window


def graph_width(backend: Any, module: Any) -> int | None:
    """Context width of the captured ratio-1/2 indexer metadata, in tokens.

    ``prefill.max_seq_len`` when set (0.5.22's ``_low_ratio_prefill_indexer_metadata`` clips
    the page table to it).  Unset (fix 5 lifted the 16,384 cap, or nothing set it), the
    metadata spans the whole captured page table: ``prefill.max_context_size`` when set, else
    the ``req_to_token`` width (``MAX_SEQ_LEN_FOR_CAPTURE``).  None when neither is known.
    """
    max_seq_len = module._prefill_graph_max_seq_len()
    if max_seq_len is not None:
        return int(max_seq_len)
    width = None
    try:
        from sglang.srt.runtime_context import get_exec

        width = get_exec().graph.cuda_graph_config.prefill.max_context_size
    except Exception:  # noqa: BLE001 - no runtime context outside a scheduler
        width = None
    if width is None:
        width = getattr(backend, "MAX_SEQ_LEN_FOR_CAPTURE", None)
    return None if width is None else int(width)


def fits(backend: Any, module: Any) -> bool:
    """The PR's ``_low_ratio_graph_fits_candidates``: the graph is no wider than the window."""
    low = tuple(getattr(backend, "low_ratios", ()) or ())
    if not low:
        return True
    window = candidate_window(backend)
    if window <= 0:
        return True
    width = graph_width(backend, module)
    if width is None:
        return True
    return width // min(low) <= window


def build(module: ModuleType, original: Any, ctx: Any) -> property:
    """The patched property: ``original(self) and fits(self)``.

    Under ``--enable-decoder-swa-bounded-replay`` keeping the sources eager also needs fix 4;
    where fix 4 is not active the getter stands aside (the stock answer, so capture fails with
    SGLang's own candidate-window assert instead of a device-side repeat_interleave assert).
    """
    if not isinstance(original, property) or original.fget is None:
        raise Refused(f"{CLASS}.{ATTR} is not a property")
    orig_fget = original.fget
    fix4_active = ctx.is_active
    # Fix 4's verdict is final once the backend module is patched; look it up once.
    fix4: list[bool] = []

    def low_ratio_prefill_graph(self) -> bool:
        if not orig_fget(self):
            return False
        if fits(self, module):
            return True
        if getattr(self, "enable_decoder_swa_bounded_replay", False):
            if not fix4:
                fix4.append(fix4_active(4))
                if not fix4[0]:
                    logger.warning(
                        "sglang-warmup: fix 1 stands aside: --enable-decoder-swa-bounded-replay "
                        "needs fix 4, which is not active; a prefill graph wider than the "
                        "candidate window will fail at capture")
            if not fix4[0]:
                return True
        return False

    low_ratio_prefill_graph.__doc__ = orig_fget.__doc__
    low_ratio_prefill_graph.__qualname__ = orig_fget.__qualname__
    low_ratio_prefill_graph.__module__ = orig_fget.__module__
    low_ratio_prefill_graph.__wrapped__ = orig_fget  # type: ignore[attr-defined]
    setattr(low_ratio_prefill_graph, MARK, NUMBER)
    return property(low_ratio_prefill_graph, original.fset, original.fdel, original.__doc__)


def verify(module: ModuleType, installed: Any, original: Any) -> str:
    """Detect again on the installed property: wide graphs now keep the sources eager."""
    fget = installed.fget
    if getattr(fget, MARK, None) != NUMBER or fget.__wrapped__ is not original.fget:
        raise AssertionError(f"{CLASS}.{ATTR} is not the fix-1 property over the original")
    probe_orig = clone(original.fget, globals_=_probe_overrides())
    if not call_quietly(lambda: probe_orig(_probe_backend()))[0]:
        return "verified structurally (the original is False on the probe, no behaviour to compare)"

    def patched_at(width: int) -> bool:
        view = SimpleNamespace(_prefill_graph_max_seq_len=lambda: width)
        return bool(clone(fget, closure={"orig_fget": probe_orig, "module": view})(
            _probe_backend()))

    wide, narrow = patched_at(PROBE_WIDE), patched_at(PROBE_NARROW)
    if wide or not narrow:
        raise AssertionError(
            f"probe: {PROBE_WIDE:,} -> {wide}, {PROBE_NARROW:,} -> {narrow} "
            "(expected False, True)")
    return (f"verified: a {PROBE_WIDE:,}-token graph keeps the sources eager, "
            f"{PROBE_NARROW:,} still captures them")
