"""Fix 5: lift the 16,384-token prefill-graph context cap that SGLang 0.5.22 sets for
DeepSeek-V4.1 in ``validate_deepseek_v41_features`` (``srt/arg_groups/deepseek_v4_hook.py``).

The cap exists because of the bug fix 1 removes: without ``--cuda-graph-max-seq-len-prefill``
the hook declares ``prefill.max_seq_len = 16384``, so longer contexts run eager prefill and the
captured ratio-1/2 indexer stays inside the candidate window.  With fixes 1 and 2 active the
graph is correct at any width, and 0.5.23 dropped the cap on CUDA.

The cap is applied while the launcher process validates the server arguments; schedulers only
receive the resolved arguments.  So this fix patches the hook module when the launcher imports
it (the plugin arms the import hook before ``ServerArgs`` exist), and decides per launch, at
validation time, from the arguments themselves and from what fixes 1, 2 and 4 will do in the
schedulers (read from the backend's source file; the launcher never imports the backend).

The cap stays (the rewritten condition still applies it) when:
* the launch asks for no prefill-graph context above 16,384 tokens
  (``--cuda-graph-prefill-max-context``, alias ``--context-bucket``): a launch that captured
  before captures exactly as before, warm-up or not (PR #44627: "configurations that captured
  before are unchanged");
* the platform is not CUDA: the ROCm radix backend builds its fixed-width prefill-graph
  metadata at ``prefill.max_seq_len`` (``_graph_metadata_max_seq_len``), and 0.5.23 keeps
  16K there too;
* fix 1 or fix 2 is not active (off, refused, or not applicable);
* ``--enable-decoder-swa-bounded-replay`` is on and fix 4 is not active, or WARMUP_FIX_5 is
  ``auto``: upstream found that the tail's source-KV write gets captured when the ratio-1/2
  sources run eager (fixed in 0.5.23 by #45407, unverified for 0.5.22's tail), so lifting the
  cap for operators who did not ask for a wide graph waits for a GPU smoke test.
  ``WARMUP_FIX_5=on`` lifts it there too, provided fix 4 is active.
An explicit ``--cuda-graph-max-seq-len-prefill`` is never touched: SGLang skips the cap then.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from warmup.patches.source import MARK, FileView, LiveView, guarded_rewrite, source_hash
from warmup.patches.status import Detection, Refused

NUMBER = 5
NAME = "context-cap"
SUMMARY = "lift the 16,384-token DeepSeek-V4.1 prefill-graph context cap when fixes 1+2 are active"
MODULE = "sglang.srt.arg_groups.deepseek_v4_hook"
CLASS = None
ATTR = "validate_deepseek_v41_features"
TARGET = f"{MODULE}:{ATTR}"

BUGGY = {ATTR: "c5bf936f95bbc517"}  # 0.5.22
FIXED = {ATTR: "454d8318f6c9a5a6"}  # 0.5.23: the cap block is gone
CAP = "max_seq_len=16 * 1024"
CAP_TOKENS = 16 * 1024
INJECTED = "__sglang_warmup_keep_cap__"
OLD = (
    "    if (\n"
    "        prefill_graph.backend != Backend.DISABLED\n"
    "        and prefill_graph.max_seq_len is None\n"
    "        and not cp_breakable_prefill\n"
    "    ):\n"
)
NEW = OLD.replace("and not cp_breakable_prefill\n",
                  f"and not cp_breakable_prefill and {INJECTED}(cfg)\n")

logger = logging.getLogger("sglang_warmup.patches")


def detect(view: LiveView | FileView, ctx: Any = None) -> Detection:
    text = view.source(ATTR)
    digest = source_hash(text)
    if CAP not in text:
        match = "exact" if digest == FIXED[ATTR] else "structural"
        return Detection(False, match, "the hook sets no 16,384-token prefill-graph cap")
    if INJECTED in text:
        return Detection(False, "structural", "the cap is already conditional on sglang-warmup")
    return Detection(True, "exact" if digest == BUGGY[ATTR] else "structural",
                     "DeepSeek-V4.1 prefill graphs are capped at 16,384 tokens of context")


def requires(ctx: Any) -> str | None:
    """Fixes 1 and 2 must be active in the schedulers, or lifting the cap breaks capture."""
    # Fix 2 first: when it is inactive fix 1 is refused for that reason, so name the cause.
    for number, what in ((2, "fix 2 (fused compressor rows)"), (1, "fix 1 (low-ratio window)")):
        status = ctx.status(number)
        if not status.active:
            return f"{what} is {status.verdict} ({status.reason}); the 16,384 cap stays"
    return None


def decide(cfg: Any, platform: Any, ctx: Any) -> tuple[bool, str]:
    """Whether this launch lifts the cap, and why (one sentence)."""
    asked = getattr(cfg.cuda_graph_config.prefill, "max_context_size", None)
    if asked is None or asked <= CAP_TOKENS:
        shown = "no --cuda-graph-prefill-max-context" if asked is None else (
            f"--cuda-graph-prefill-max-context {asked}")
        return False, (f"the launch asks for no prefill-graph context above {CAP_TOKENS:,} "
                       f"({shown}); SGLang's cap stands")
    if not getattr(platform, "is_cuda", False) or getattr(platform, "is_hip", False):
        return False, ("the platform is not CUDA (the ROCm radix backend sizes its graph "
                       "metadata by the cap)")
    problem = requires(ctx)
    if problem:
        return False, problem
    if getattr(cfg, "enable_decoder_swa_bounded_replay", False):
        fix4 = ctx.status(4)
        if not fix4.active:
            return False, (f"--enable-decoder-swa-bounded-replay needs fix 4, which is "
                           f"{fix4.verdict} ({fix4.reason})")
        if ctx.mode(NUMBER) != "on":
            return False, ("--enable-decoder-swa-bounded-replay is on and the tail's source-KV "
                           "write under eager sources is unverified on 0.5.22; set "
                           "WARMUP_FIX_5=on to lift the cap anyway")
        return True, "fixes 1, 2 and 4 are active and WARMUP_FIX_5=on"
    return True, "fixes 1 and 2 are active on CUDA"


def build(module: ModuleType, original: Any, ctx: Any) -> Any:
    problem = requires(ctx)
    if problem:
        raise Refused(problem)
    if CAP not in LiveView(module).source(ATTR):
        raise Refused(f"the installed {ATTR} sets no 16,384-token cap: nothing to lift")

    def keep_cap(cfg: Any) -> bool:
        try:
            lift, reason = decide(cfg, module.get_platform(), ctx)
        except Exception as exc:  # noqa: BLE001 - a guest keeps SGLang's default
            lift, reason = False, f"decision failed ({type(exc).__name__}: {exc})"
        ctx.record_cap(lift, reason)
        if lift:
            logger.info("sglang-warmup: fix 5 lifted the 16,384-token prefill-graph context "
                        "cap for DeepSeek-V4.1: %s", reason)
        else:
            logger.info("sglang-warmup: fix 5 kept the 16,384-token prefill-graph context cap: "
                        "%s", reason)
        return not lift

    return guarded_rewrite(original, what=ATTR, old=OLD, new=NEW, inject={INJECTED: keep_cap},
                           fix=NUMBER)


def verify(module: ModuleType, installed: Any, original: Any) -> str:
    if getattr(installed, MARK, None) != NUMBER:
        raise AssertionError(f"{ATTR} is not the fix-5 rewrite")
    if detect(LiveView(module)).needed:
        raise AssertionError("the unconditional cap is still in the installed function")
    return ("verified: the cap now applies only when sglang-warmup keeps it (decided at "
            "validation, logged once per launch)")
