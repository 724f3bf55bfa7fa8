"""``torch.compile`` compiles in this process, from Dynamo's compile callbacks.

A function under ``torch.compile`` (SGLang's sampling penalties, among others) is traced and
compiled again for every new guard set: a batch of one against several, another dtype or
stride.  That costs tens to hundreds of milliseconds even when Inductor then finds every kernel
in its caches, so no Triton compile is recorded.  Dynamo calls its start and end callbacks
around each such compile (``torch._dynamo.callback.callback_handler``); each becomes a
``jit_build`` of compiler ``dynamo`` with its duration and the function compiled, and, when it
is a recompile, the guard of the earlier graph that failed (``reason``: Dynamo works it out for
every recompile, logged or not, and keeps it in the compile's metrics context).  Armed when
``torch._dynamo.callback`` is imported: nothing here imports torch.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import types
from typing import Any

from cache_tools import compile_log
from warmup.observe import importer
from warmup.observe.recorder import Recorder


MODULE = "torch._dynamo.callback"
HOOK = f"{MODULE}.callback_handler"


class DynamoHooks:
    """Our start and end callbacks on Dynamo's handler, for one installation."""

    def __init__(self, inst: Recorder) -> None:
        self.inst = inst
        self.started: dict[int, tuple[float, str | None, str | None]] = {}

    def install(self) -> None:
        module = sys.modules.get(MODULE)
        try:
            if module is not None:
                self._register(module)
                self.inst.add(HOOK, "installed")
                return
            self.inst.on_uninstall(importer.finder().watch(
                MODULE, functools.partial(self._register_on_import)))
            self.inst.add(HOOK, "armed", "registered when torch._dynamo is imported")
        except Exception as exc:  # a guest never raises into its host
            self.inst.add(HOOK, "failed", repr(exc))

    def _register_on_import(self, module: Any) -> None:
        if not self.inst.active:
            return
        try:
            self._register(module)
        except Exception as exc:  # a guest never raises into its host's import: counted, logged
            self.inst.failed("dynamo", exc)

    def _register(self, module: Any) -> None:
        handler = getattr(module, "callback_handler", None)
        if handler is None:
            raise AttributeError(f"{MODULE} has no callback_handler")
        handler.register_start_callback(self.start)
        handler.register_end_callback(self.end)
        self.inst.on_uninstall(functools.partial(_remove, handler, self.start, self.end))

    def start(self, *args: Any) -> None:
        """Dynamo begins compiling a frame (the outermost of nested compiles)."""
        try:
            self.started[threading.get_ident()] = (time.perf_counter(), _compiled_function(),
                                                   _recompile_reason(args))
        except Exception as exc:  # a guest never raises into Dynamo's compile: counted, logged
            self.inst.failed("dynamo", exc)

    def end(self, *args: Any) -> None:
        """Dynamo is done: one build, named by the function it compiled."""
        try:
            began = self.started.pop(threading.get_ident(), None)
            if began is None:
                return
            compile_id = getattr(args[0], "compile_id", None) if args else None
            name = began[1] or "torch.compile"
            if compile_id is not None:
                name = f"{name} [{compile_id}]"
            trigger = _other_trigger(args)
            if trigger:     # the same callbacks around a CUDA graph recorded, a lazy backward
                name = f"{name} ({trigger})"
            self.inst.build(compile_log.BUILT, name, round(time.perf_counter() - began[0], 4),
                            compiler=compile_log.DYNAMO, reason=began[2])
        except Exception as exc:  # a guest never raises into Dynamo's compile: counted, logged
            self.inst.failed("dynamo", exc)


def _compiled_function() -> str | None:
    """``file:function`` of the code object Dynamo is converting, read from the caller frames
    (Dynamo's ``_compile(code, ...)``); None when it is not found."""
    frame: types.FrameType | None = sys._getframe(2)
    depth = 0
    while frame is not None and depth < 40:
        code = frame.f_locals.get("code") if frame.f_code.co_name in ("_compile",
                                                                       "compile_inner") else None
        if isinstance(code, types.CodeType):
            return f"{_short(code.co_filename)}:{code.co_name}"
        frame, depth = frame.f_back, depth + 1
    return None


def _recompile_reason(args: tuple[Any, ...]) -> str | None:
    """The guard failure that made Dynamo compile this frame again, or None for a first compile
    and for callbacks of other triggers (a CUDA graph recorded, a lazy backward).

    Dynamo computes it for every recompile (``get_and_maybe_log_recompilation_reasons``) and
    puts it in the metrics context of the compile before our start callback runs; reading it
    there needs no ``TORCH_LOGS``.  The context keeps its values after the compile, so it is
    read only inside one, for Dynamo's own trigger.  Private to torch: anything unexpected
    reads as None."""
    if _other_trigger(args):
        return None
    utils = sys.modules.get("torch._dynamo.utils")
    get_context = getattr(utils, "get_metrics_context", None)
    if get_context is None:
        return None
    context = get_context()
    in_progress = getattr(context, "in_progress", None)
    if not callable(in_progress) or not in_progress():
        return None
    values = getattr(context, "_metrics", None)
    reason = values.get("recompile_reason") if isinstance(values, dict) else None
    return reason[:compile_log.MAX_REASON] if isinstance(reason, str) and reason else None


def _other_trigger(args: tuple[Any, ...]) -> str:
    """The callbacks' trigger in lower case when it is not Dynamo's compile (``cudagraph_recording``,
    ``lazy_backward``, ``triton_autotuning``), else ''."""
    trigger = getattr(args[0], "callback_trigger", None) if args else None
    name = getattr(trigger, "name", None)
    return name.lower() if isinstance(name, str) and name != "DYNAMO" else ""


def _short(path: str) -> str:
    marker = f"site-packages{os.sep}"
    i = path.rfind(marker)
    return path[i + len(marker):] if i >= 0 else os.path.basename(path)


def _remove(handler: Any, start: Any, end: Any) -> None:
    for remove, callback in ((handler.remove_start_callback, start),
                             (handler.remove_end_callback, end)):
        try:
            remove(callback)
        except ValueError:
            pass  # cleared by someone else
