"""The device allocator's blocks across the warm-up's flush.

SGLang's ``Scheduler.flush_cache`` resets the radix cache and the KV pools and then, by default,
empties PyTorch's caching allocator (``current_platform.empty_cache()``).  After a warm-up that
hands back to the driver every block the warm-up's requests grew: activations, logits and
sampling buffers of every size the plan sent.  The first real requests after ready then pay
``cudaMalloc`` for them again, a first-hit cost with no compile behind it, which is what the
warm-up was for.

So the warm-up's own flush (the driver sets the phase to ``warmup`` / :data:`phase.FLUSH` before
it asks for the flush, in every process through the state directory) runs with
``empty_cache=False``: the radix cache and the KV pools are reset as before, the allocator keeps
its blocks.  Any other flush (an operator's ``/flush_cache`` while serving, a weight update's) is
SGLang's, unchanged.  Keeping the blocks costs no memory that serving could not take back: the
KV pool was sized at start-up, and when a ``cudaMalloc`` fails the caching allocator frees its
unused cached blocks and retries before it reports out of memory.

Armed by the plugin in every scheduler (``WARMUP_KEEP_ALLOCATOR``, on by default); a
``flush_cache`` without the ``empty_cache`` argument (an SGLang older than the ones we know) is
left alone, with a log line.  It never raises into SGLang.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from types import ModuleType
from typing import Any, Callable

logger = logging.getLogger("sglang_warmup.allocator")

SCHEDULER = "sglang.srt.managers.scheduler"


def is_warmup_flush() -> bool:
    """True while the driver's final flush is in flight: the phase names it."""
    from warmup.observe import phase

    state = phase.current()
    return state.phase == "warmup" and state.shape_class == phase.FLUSH


def reserved_bytes() -> int | None:
    """Bytes the caching allocator holds on the current device, None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.memory_reserved())
    except Exception:
        return None


def keeping(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.flush_cache`` that keeps the allocator's blocks on the warm-up's flush."""

    @functools.wraps(original)
    def flush_cache(self, *args, **kwargs):
        if args or "empty_cache" in kwargs:  # a caller that chose: SGLang's own call
            return original(self, *args, **kwargs)
        try:
            ours = is_warmup_flush()
        except Exception:
            ours = False
        if not ours:
            return original(self, *args, **kwargs)
        success = original(self, empty_cache=False)
        if success:
            held = reserved_bytes()
            logger.info("sglang-warmup: the warm-up's flush kept the caching allocator's blocks%s "
                        "(WARMUP_KEEP_ALLOCATOR=0 empties it, as SGLang's flush does)",
                        f" ({held / 2**20:,.0f} MiB)" if held is not None else "")
            record(held)
        return success

    flush_cache.__sglang_warmup__ = True  # type: ignore[attr-defined]
    return flush_cache


def record(held: int | None) -> None:
    """The kept blocks as an ``allocator`` record in this process's compile log (the run
    report shows it); never raises."""
    try:
        from cache_tools import compile_log
        from warmup.observe import events

        events.note(compile_log.ALLOCATOR, "torch", kept_bytes=held)
    except Exception as exc:  # bookkeeping never fails SGLang's flush
        logger.debug("sglang-warmup: allocator record not written: %r", exc)


def _wrap(module: ModuleType) -> None:
    cls = getattr(module, "Scheduler", None)
    original = getattr(cls, "flush_cache", None)
    if original is None or getattr(original, "__sglang_warmup__", False):
        return
    try:
        takes = "empty_cache" in inspect.signature(original).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        logger.warning("sglang-warmup: this SGLang's Scheduler.flush_cache takes no empty_cache; "
                       "the warm-up's flush empties the caching allocator, as SGLang's does")
        return
    cls.flush_cache = keeping(original)


def arm() -> None:
    """Wrap ``Scheduler.flush_cache`` now or when SGLang imports it (before any scheduler binds
    it: SGLang hands ``self.flush_cache`` to its flush handler when a scheduler is built)."""
    module = sys.modules.get(SCHEDULER)
    if module is not None:
        _wrap(module)
    else:
        from warmup.observe.importer import finder

        finder().watch(SCHEDULER, _wrap)
