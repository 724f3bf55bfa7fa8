"""Inductor's compile workers: load sglang-warmup's compile hooks there too.

Kernels that ``torch.compile`` generates are compiled by Inductor in a worker process
(``torch/_inductor/compile_worker``), which SGLang's plugin loader never reaches, and launched
by Inductor's static CUDA launcher, which bypasses Triton's load hooks.  So Triton's
compilation listener has to run in the worker.  Inductor names the worker's pickler class on
the worker's command line (``--pickler module.Class``) and instantiates it there: our pickler
(a plain ``SubprocPickler``) installs the compile hooks when it is created.  The worker forks
its compile processes after that, so they inherit the hooks; they read the phase from the
shared state directory like every other process.

``arm()`` (called by the plugin) makes our pickler the default of ``SubprocPool`` right after
Inductor's module is first imported; a process that never uses Inductor never imports it.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

from warmup import settings
from warmup.observe import events, importer

logger = logging.getLogger("sglang_warmup.inductor")

POOL_MODULE = "torch._inductor.compile_worker.subproc_pool"
_MARK = "__sglang_warmup_inductor__"


def arm() -> None:
    """Give Inductor's compile-worker pools our pickler, now or when Inductor is imported."""
    module = sys.modules.get(POOL_MODULE)
    if module is not None:
        _patch(module)
        return
    importer.finder().watch(POOL_MODULE, _patch)


def _patch(module: ModuleType) -> None:
    pool = getattr(module, "SubprocPool", None)
    if pool is None or getattr(module, "SubprocPickler", None) is None:
        logger.info("sglang-warmup: this torch has no Inductor SubprocPool; its workers are not hooked")
        return
    original = pool.__init__
    if getattr(original, _MARK, False):
        return

    def __init__(self: Any, nprocs: int, pickler: Any = None, *args: Any, **kwargs: Any) -> None:
        if pickler is None:
            try:
                pickler = pickler_class()()
            except Exception as exc:  # never break Inductor
                logger.warning("sglang-warmup: Inductor workers not hooked: %s", exc)
        original(self, nprocs, pickler, *args, **kwargs)

    setattr(__init__, _MARK, True)
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    pool.__init__ = __init__


def _install_here() -> None:
    """In an Inductor worker (or anywhere the pickler is created): install the compile hooks
    when sglang-warmup is enabled.  Never raises."""
    try:
        if not (settings.ENABLE.get() and settings.METRICS.get()):
            return
        events.install()
    except Exception as exc:  # a guest never raises into its host
        logger.warning("sglang-warmup: compile hooks not installed in this Inductor worker: %s", exc)


_pickler: type | None = None


def pickler_class() -> type:
    """``HookedPickler``: a plain ``SubprocPickler`` that installs our hooks where it is made."""
    global _pickler
    if _pickler is None:
        from torch._inductor.compile_worker.subproc_pool import SubprocPickler

        class HookedPickler(SubprocPickler):
            def __init__(self) -> None:
                super().__init__()
                _install_here()

        HookedPickler.__module__ = __name__
        HookedPickler.__qualname__ = "HookedPickler"
        _pickler = HookedPickler
    return _pickler


def __getattr__(name: str) -> Any:
    # Inductor's worker looks the class up by name: ``warmup.observe.inductor.HookedPickler``.
    if name == "HookedPickler":
        return pickler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
