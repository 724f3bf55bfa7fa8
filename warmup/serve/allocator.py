"""The device allocator's blocks: kept across the warm-up's flush, and one reserved for the
GEMM sweep's outputs (:func:`reserve`).

SGLang's ``Scheduler.flush_cache`` resets the radix cache and the KV pools and then, by default,
empties PyTorch's caching allocator (``current_platform.empty_cache()``).  After a warm-up that
hands back to the driver every block the warm-up's requests grew: activations, logits and
sampling buffers of every size the plan sent.  The first real requests after ready then pay
``cudaMalloc`` for them again, a first-hit cost with no compile behind it, which is what the
warm-up was for.

So the warm-up's own flush runs with ``empty_cache=False``: the radix cache and the KV pools are
reset as before, the allocator keeps its blocks.  What makes a flush the warm-up's:

* it is a flush *request* (``/flush_cache``): the plugin wraps the ``flush_cache`` callable that
  SGLang's ``SchedulerFlushWrapper`` receives when a scheduler is built, and nothing else; a
  scheduler's other callers of ``flush_cache`` (``release_memory_occupation``, weight updates,
  RPC) call the scheduler's method directly and are never touched;
* the phase file says ``warmup`` / :data:`phase.FLUSH` (the driver sets it, in every process
  through the state directory, before it asks for the flush), set no longer ago than the flush
  could have waited for an idle scheduler (:func:`fresh_for_s`): a driver that died mid-flush
  leaves a stale phase, which then counts for nothing.

Any other flush is SGLang's, unchanged.  Without a state directory the scheduler processes cannot
see the driver's phase, so nothing is wrapped (each process of the server logs it once).  Kept blocks are memory SGLang
leaves outside its KV pool for activations, which serving grows anyway; when a ``cudaMalloc``
fails, the caching allocator frees its unused unsplit cached blocks and retries, which usually
gives them back (docs/serve.md says where it does not).

Armed by the plugin in every scheduler (``WARMUP_KEEP_ALLOCATOR``, on by default).  A
``flush_cache`` without the ``empty_cache`` argument (an SGLang older than the ones we know) is
left alone, with a log line.  It never raises into SGLang.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
from types import ModuleType
from typing import Any, Callable

from warmup import settings

logger = logging.getLogger("sglang_warmup.allocator")

#: SGLang's module of the class that answers flush requests in a scheduler, and the scheduler's
#: own module (which imports it at the top, in every SGLang that has it).
FLUSH_WRAPPER = "sglang.srt.managers.scheduler_components.flush_wrapper"
SCHEDULER = "sglang.srt.managers.scheduler"
#: Slack on top of the flush timeout (the driver's request, the scheduler's loop, the clocks of
#: two hosts where a sidecar drives the warm-up).
SLACK_S = 60.0
#: The shortest wait a flush is allowed, whatever this process's flush timeout: a sidecar's
#: driver may wait longer (its own ``--flush-timeout``) than the server's setting says.
MIN_WAIT_S = 600.0


def fresh_for_s() -> float:
    """How long after the driver named its flush in the phase that flush may still arrive: it
    waits for an idle scheduler at most its flush timeout (``WARMUP_FLUSH_TIMEOUT_S`` here, at
    least :data:`MIN_WAIT_S`)."""
    return max(settings.FLUSH_TIMEOUT_S.get(), MIN_WAIT_S) + SLACK_S


def is_warmup_flush(now: float | None = None) -> bool:
    """True while the driver's final flush is in flight: the phase names it, recently (a phase
    left by a driver that died during its flush counts for nothing, with a log line)."""
    from warmup.observe import phase

    state = phase.current()
    if state.phase != "warmup" or state.shape_class != phase.FLUSH:
        return False
    age = (time.time() if now is None else now) - state.since
    if -SLACK_S <= age <= fresh_for_s():
        return True
    logger.warning("sglang-warmup: the phase names the warm-up's flush, but set %.0f s ago: "
                   "stale (a driver that stopped during its flush?); this flush empties the "
                   "caching allocator, as SGLang's does", age)
    return False


def cached_free_bytes() -> int | None:
    """Bytes the caching allocator holds on the current device and no tensor uses (reserved
    minus allocated: what emptying it would at most hand back); None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.memory_reserved()) - int(torch.cuda.memory_allocated())
    except Exception:  # a guest in SGLang's flush: a torch that cannot answer (any kind), no number
        return None


def keeping(flush_cache: Callable[..., Any]) -> Callable[[], Any]:
    """The callable a flush request calls: ``flush_cache()``, or on the warm-up's flush
    ``flush_cache(empty_cache=False)``."""

    @functools.wraps(flush_cache)
    def flush(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs:                       # a caller that chose: SGLang's call, unchanged
            return flush_cache(*args, **kwargs)
        try:
            ours = is_warmup_flush()
        except Exception as exc:  # a guest never raises into SGLang's flush: its own flush then
            logger.debug("sglang-warmup: flush not recognised as the warm-up's: %r", exc)
            ours = False
        if not ours:
            return flush_cache()
        success = flush_cache(empty_cache=False)
        if success:
            kept = cached_free_bytes()
            logger.info("sglang-warmup: the warm-up's flush kept the caching allocator's blocks%s "
                        "(WARMUP_KEEP_ALLOCATOR=0 empties them, as SGLang's flush does)",
                        f" ({kept / 2**20:,.0f} MiB cached and unused)" if kept is not None
                        else "")
            record(kept)
        return success

    flush.__sglang_warmup__ = True  # type: ignore[attr-defined]
    return flush


def record(kept: int | None) -> None:
    """The kept blocks as an ``allocator`` record in this process's compile log (the run
    report shows it); never raises."""
    try:
        from cache_tools import compile_log
        from warmup.observe import events

        events.note(compile_log.ALLOCATOR, "torch", kept_bytes=kept)
    except Exception as exc:  # bookkeeping never fails SGLang's flush
        logger.debug("sglang-warmup: allocator record not written: %r", exc)


def _takes_the_choice(flush_cache: Any) -> bool:
    try:
        return "empty_cache" in inspect.signature(flush_cache).parameters
    except (TypeError, ValueError):
        return False


def _wrap(module: ModuleType) -> None:
    cls = getattr(module, "SchedulerFlushWrapper", None)
    if cls is None:     # else the __init__ found would be None's, and said to take no flush_cache
        logger.warning("sglang-warmup: this SGLang's %s has no SchedulerFlushWrapper; the "
                       "warm-up's flush empties the caching allocator, as SGLang's does",
                       module.__name__)
        return
    init = getattr(cls, "__init__", None)
    if init is None or getattr(init, "__sglang_warmup__", False):
        return
    try:
        takes = "flush_cache" in inspect.signature(init).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        logger.warning("sglang-warmup: this SGLang's SchedulerFlushWrapper takes no flush_cache; "
                       "the warm-up's flush empties the caching allocator, as SGLang's does")
        return

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            bound = inspect.signature(init).bind(self, *args, **kwargs)
        except TypeError:                        # SGLang's own error, from SGLang's own call
            return init(self, *args, **kwargs)
        flush_cache = bound.arguments.get("flush_cache")
        if flush_cache is not None and _takes_the_choice(flush_cache):
            bound.arguments["flush_cache"] = keeping(flush_cache)
        elif flush_cache is not None:
            logger.warning("sglang-warmup: this SGLang's flush_cache takes no empty_cache; the "
                           "warm-up's flush empties the caching allocator, as SGLang's does")
        init(*bound.args, **bound.kwargs)

    __init__.__sglang_warmup__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def arm() -> None:
    """Wrap ``SchedulerFlushWrapper`` now or when SGLang imports it (before any scheduler is
    built: each scheduler hands it ``self.flush_cache`` then)."""
    from warmup.observe import phase

    if phase.resolve_state_dir() is None:
        logger.info("sglang-warmup: no state directory (WARMUP_STATE_DIR), so the schedulers "
                    "cannot see the warm-up's phase: its flush empties the caching allocator, as "
                    "SGLang's does")
        return
    module = sys.modules.get(FLUSH_WRAPPER)
    if module is not None:
        _wrap(module)
    elif SCHEDULER in sys.modules:   # the scheduler is loaded and never imported a flush wrapper
        logger.warning("sglang-warmup: this SGLang has no %s; the warm-up's flush empties the "
                       "caching allocator, as SGLang's does", FLUSH_WRAPPER)
    else:
        from warmup.observe.importer import finder

        finder().watch(FLUSH_WRAPPER, _wrap)


def reserve(nbytes: int, device: Any) -> None:
    """Have PyTorch's caching allocator hold one free block of ``nbytes``, the largest output
    of the GEMM sweep (warmup/serve/gemm_sweep.py), so that every output over 1 MiB is carved
    from it (the allocator splits a larger free block; outputs of 1 MiB or less come from its
    small pool's 2 MiB segments).

    Without it an output that outgrew every free block waited for ``cudaMalloc`` (a new
    segment: 20 MiB for 1-10 MiB, from 10 MiB the size rounded up to a multiple of 2 MiB),
    0.5 ms or more, which the sweep took for a kernel load.  An LM head of 65,600 bf16 columns
    outgrows its segment every 16 rows past 159 (20 MiB), so most of its load rows were
    allocations, swept again at every start from a steps record and warming nothing.  The
    sweep asks for cuBLAS's workspace first (32 MiB on Hopper), which would otherwise be carved
    from the block; cuBLASLt's (1 MiB unless ``CUBLASLT_WORKSPACE_SIZE`` says more) comes from
    the small pool.  With ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb`` below the block's size the
    allocator does not split it, and outputs are allocated as they come, as without it."""
    import torch

    if nbytes <= 0:
        return
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    except Exception as exc:  # noqa: BLE001 - no room: each output is allocated as it comes
        logger.info("sglang-warmup: GEMM sweep: no %.3g MiB block reserved for its outputs "
                    "(%s); they are allocated as they come, and some load rows may be "
                    "allocations", nbytes / (1 << 20), exc)
        return
    del block                       # freed into the allocator's cache, not to the device
