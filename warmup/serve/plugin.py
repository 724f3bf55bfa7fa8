"""SGLang plugin entry point (group ``sglang.srt.plugins``): activates sglang-warmup inside
every SGLang process, gated by WARMUP_ENABLE=1.

SGLang calls ``register()`` first thing in the launcher, in every scheduler, in the
detokenizer and in the data-parallel controller (SGLang >= 0.5.13).  It must stay cheap and
must never raise into SGLang: each step logs its own failure and the others still run.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Callable

from warmup import settings

logger = logging.getLogger("sglang_warmup.plugin")

_registered = False


def register() -> None:
    """Install compile-event hooks, arm the lazy prefill-graph patches, the GEMM sweep and the
    allocator's blocks across the warm-up's flush, and register the plan."""
    global _registered
    if _registered or not settings.ENABLE.get():
        return
    _registered = True
    for name, step in steps():
        try:
            step()
        except Exception as exc:  # a guest never raises into its host
            if name == "plan":
                # A plan that cannot be registered must stop the launcher: starting cold
                # while the operator asked for a warm start is the failure we exist to prevent.
                raise
            logger.warning("sglang-warmup: %s not activated: %s", name, exc)


def _install_events() -> None:
    if not settings.METRICS.get():
        return
    from warmup.observe import events

    events.install()
    _arm_serving_marker()
    from warmup.observe import inductor

    inductor.arm()  # Inductor compiles torch.compile kernels in workers of its own
    _start_cache_watch()


def steps() -> tuple[tuple[str, Callable[[], None]], ...]:
    """What :func:`register` does, in order, by name (each step is a no-op where its setting
    turns it off)."""
    return (("events", _install_events), ("patches", _activate_patches),
            ("GEMM sweep", _arm_gemm_sweep), ("allocator", _arm_allocator),
            ("plan", _register_plan))


def _is_main_process() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is None


def _start_cache_watch() -> None:
    """In the server's main process only (one watcher per server): the cache directories of
    the libraries whose builds no hook sees."""
    interval = settings.CACHE_WATCH_S.get()
    if interval <= 0 or not _is_main_process():
        return
    import atexit

    from warmup.observe import cache_watch, events

    watch = cache_watch.CacheWatch(events.record_build, interval)
    watch.start()
    atexit.register(watch.stop)   # builds still without their marker: recorded as cut short


def _arm_serving_marker() -> None:
    """Without a plan, nothing of ours ends a warm-up; take SGLang's own "serving started"
    moment (``triton_load_watch.mark_serving_started``, SGLang >= 0.5.19) as the start of the
    ``serving`` phase.  With a plan, the driver flips the phase after the warm-up instead; a
    sidecar sharing the state directory flips it after its own warm-up."""
    if settings.PLAN.get():
        return
    try:
        from sglang.srt.utils import triton_load_watch as watch
    except ImportError:
        watch = None
    if watch is None or not hasattr(watch, "mark_serving_started"):
        _serving_when_sglang_is_up()  # SGLang < 0.5.19
        return
    original = watch.mark_serving_started
    if getattr(original, "__sglang_warmup__", False):
        return

    def mark_serving_started(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            from warmup.observe import phase

            phase.set_phase("serving")

    mark_serving_started.__sglang_warmup__ = True  # type: ignore[attr-defined]
    watch.mark_serving_started = mark_serving_started


def _serving_when_sglang_is_up() -> None:
    """The ``serving`` phase for a launch without a plan on an SGLang without
    ``mark_serving_started``: in the main process, once SGLang's tokenizer manager reports
    itself up (after its own warm-up request), as the hook does after a plan."""
    if not _is_main_process():
        return
    import threading
    import time

    def wait() -> None:
        from warmup.observe import phase
        from warmup.serve import hook

        deadline = time.monotonic() + hook.ready_wait_s()
        while time.monotonic() < deadline:
            http = sys.modules.get("sglang.srt.entrypoints.http_server")
            state = getattr(http, "_global_state", None) if http is not None else None
            manager = getattr(state, "tokenizer_manager", None)
            if manager is not None:
                hook.serving_when_up(manager, lambda: phase.set_phase("serving"))
                return
            time.sleep(0.5)

    threading.Thread(target=wait, name="sglang-warmup-serving", daemon=True).start()


def _activate_patches() -> None:
    if not settings.PATCHES.get():
        return
    from warmup import patches

    patches.activate()


def _arm_gemm_sweep() -> None:
    if settings.GEMM_SWEEP_S.get() <= 0:
        return
    from warmup.serve import gemm_sweep

    gemm_sweep.arm()


def _arm_allocator() -> None:
    if not settings.KEEP_ALLOCATOR.get():
        return
    from warmup.serve import allocator

    allocator.arm()


def _register_plan() -> None:
    if not settings.PLAN.get():
        return
    from warmup.serve import hook

    from warmup.view import text  # the entry point wires the view's text into the log lines

    runner = None
    if settings.SECOND_PASS.get():  # ... and the coverage layer into the hook
        from warmup.coverage import second_pass

        runner = functools.partial(second_pass.run, describe=text.coverage)
    hook.register_from_env(runner=runner, describe=text.run_report)
