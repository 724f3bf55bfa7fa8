"""Triton's hooks: the compilation listener, the JIT cache hooks and the kernel-load chains.

* ``triton.knobs.compilation.listener`` (single slot): a real compile (``cache_hit=False``,
  with stage times) or a load from the disk cache (``cache_hit=True``);
* ``triton.knobs.runtime.jit_cache_hook`` / ``jit_post_compile_hook`` (single slots): the first
  use of a specialization in this process; the record it carries (module, name, specialization
  data) is joined with the listener call of the same compile;
* ``triton.knobs.runtime.kernel_load_start_hook`` / ``kernel_load_end_hook`` (chains): a
  kernel's device load at its first launch, with free device memory when CUDA is initialised.

Single slots are wrapped, never replaced: our wrapper calls the previous hook, returns its
result, and records after it.  Each hook factory returns a function the host calls; none of
them raises on our account (failures go to the installation's ``failed``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from cache_tools import compile_log
from cache_tools.versions import dist_version
from warmup.observe import triton_record
from warmup.observe.recorder import Recorder


logger = logging.getLogger("sglang_warmup.events")

LISTENER = "triton.knobs.compilation.listener"
JIT_CACHE_HOOK = "triton.knobs.runtime.jit_cache_hook"
JIT_POST_COMPILE_HOOK = "triton.knobs.runtime.jit_post_compile_hook"
LOAD_START_HOOK = "triton.knobs.runtime.kernel_load_start_hook"
LOAD_END_HOOK = "triton.knobs.runtime.kernel_load_end_hook"
HOOKS = (LISTENER, JIT_CACHE_HOOK, JIT_POST_COMPILE_HOOK, LOAD_START_HOOK, LOAD_END_HOOK)

# Pending jit_cache_hook records waiting for their listener call; bounded so that compiles
# that fail (no listener call) cannot grow it.
_MAX_PENDING = 256
_MAX_LOAD_STARTS = 1024


class TritonHooks:
    """Our recorders on Triton's hooks, for one installation, and the state they share: the
    jit_cache_hook records waiting for their listener call, the device loads in flight."""

    def __init__(self, inst: Recorder) -> None:
        self.inst = inst
        self._pending: "OrderedDict[int, dict]" = OrderedDict()
        self._pending_lock = threading.Lock()
        self._load_starts: "OrderedDict[tuple[int, str], tuple[float, float | None]]" = \
            OrderedDict()
        self._options_fields: dict[tuple, frozenset[str]] = {}
        self._slots: dict[str, Any] = {}  # hook name -> our wrapper in that single slot

    # --- install ------------------------------------------------------------------------------
    def install(self) -> str | None:
        """Put our recorders on every Triton hook found; returns Triton's version."""
        inst = self.inst
        try:
            import triton
            from triton import knobs
        except Exception as exc:  # no Triton, or one without knobs (< 3.3)
            for name in HOOKS:
                inst.add(name, "missing", f"triton.knobs not importable: {exc}")
            return dist_version("triton")
        compilation = getattr(knobs, "compilation", None)
        runtime = getattr(knobs, "runtime", None)
        slots = ((LISTENER, compilation, "listener", lambda prev: _make_listener(self, prev),
                  "this Triton has no compilation listener"),
                 (JIT_CACHE_HOOK, runtime, "jit_cache_hook",
                  lambda prev: _make_jit_hook(self, prev, post=False),
                  "this Triton has no jit_cache_hook"),
                 (JIT_POST_COMPILE_HOOK, runtime, "jit_post_compile_hook",
                  lambda prev: _make_jit_hook(self, prev, post=True),
                  "this Triton has no jit_post_compile_hook"))
        for name, owner, attr, make, absent in slots:
            if owner is None or not hasattr(owner, attr):
                inst.add(name, "missing", absent)
                continue
            try:
                prev = getattr(owner, attr)
                wrapper = make(prev)
                setattr(owner, attr, wrapper)
                self._slots[name] = wrapper
                inst.on_uninstall(functools.partial(_restore_slot, owner, attr, wrapper))
                inst.add(name, "chained" if prev is not None else "installed",
                         f"wraps {_describe(prev)}" if prev is not None else "")
            except Exception as exc:  # a guest: a hook it cannot place is reported, not raised
                inst.add(name, "failed", repr(exc))

        for name, attr, end in ((LOAD_START_HOOK, "kernel_load_start_hook", False),
                                (LOAD_END_HOOK, "kernel_load_end_hook", True)):
            chain = getattr(runtime, attr, None) if runtime is not None else None
            if chain is None or not hasattr(chain, "add"):
                inst.add(name, "missing", f"this Triton has no {attr} chain")
                continue
            try:
                fn = _make_load_hook(self, end=end)
                chain.add(fn)
                inst.on_uninstall(functools.partial(chain.remove, fn))
                others = [c for c in getattr(chain, "calls", ()) if c is not fn]
                inst.add(name, "chained" if others else "installed",
                         f"alongside {', '.join(_describe(c) for c in others)}" if others else "")
            except Exception as exc:  # a guest: a hook it cannot place is reported, not raised
                inst.add(name, "failed", repr(exc))
        return getattr(triton, "__version__", None)

    def position(self, name: str) -> str | None:
        """Where our wrapper in the single-slot hook ``name`` sits now; None when ``name`` is
        not one of our single slots."""
        ours = self._slots.get(name)
        if ours is None:
            return None
        group = "compilation" if name == LISTENER else "runtime"
        return _slot_position(_get_knob(group, name.rsplit(".", 1)[1]), ours)

    # --- jit_cache_hook records waiting for their listener call -------------------------------
    def take_pending(self, src: Any) -> dict | None:
        """The jit_cache_hook record of the compile whose listener call this is, if any."""
        signature = getattr(src, "signature", None)
        if signature is None:
            return None
        with self._pending_lock:
            record = self._pending.get(id(signature))
            if record is not None and record["signature_obj"] is signature \
                    and record["jit_fn"] is getattr(src, "fn", None):
                del self._pending[id(signature)]
                return record
        return None

    def put_pending(self, record: dict) -> None:
        with self._pending_lock:
            self._pending[id(record["signature_obj"])] = record
            while len(self._pending) > _MAX_PENDING:
                self._pending.popitem(last=False)

    def drop_pending(self, signature: Any) -> dict | None:
        with self._pending_lock:
            record = self._pending.get(id(signature))
            if record is not None and record["signature_obj"] is signature:
                del self._pending[id(signature)]
                return record
        return None

    def options_fields(self, target: Any) -> frozenset[str]:
        """Names of the compile options of ``target``'s backend (cached per target)."""
        key = (getattr(target, "backend", None), getattr(target, "arch", None),
               getattr(target, "warp_size", None))
        fields = self._options_fields.get(key)
        if fields is None:
            from triton.compiler.compiler import make_backend

            options = make_backend(target).parse_options({})
            fields = frozenset(f.name for f in dataclasses.fields(options))
            self._options_fields[key] = fields
        return fields

    # --- recording ----------------------------------------------------------------------------
    def on_compile(self, src, metadata, metadata_group, times, cache_hit) -> None:
        """Record one listener call: metrics, log line and compile-log line."""
        if src is None or metadata is None:
            raise ValueError("compilation listener called without src/metadata")
        inst = self.inst
        pending = self.take_pending(src)
        state = inst.phase()
        duration = (times.total / 1e6) if times is not None else None
        event = compile_log.HIT if cache_hit else compile_log.MISS
        inst.measure(lambda m: m.compile_event(state.phase, compile_log.TRITON, event,
                                               duration if not cache_hit else None))
        if not cache_hit:
            log = logger.warning if state.phase == "serving" else logger.debug
            log("sglang-warmup: Triton compiled %s in %.3f s (phase %s)",
                getattr(src, "name", "?"), duration or 0.0, state.phase)
        if inst.log is None:
            return
        try:
            record = triton_record.build(inst.new_record(event, state, compile_log.TRITON), src,
                                         metadata, metadata_group, times, pending,
                                         self.options_fields)
        except Exception as exc:  # a guest never raises into Triton's compile: counted, logged
            inst.failed("compile_log", exc)
            return
        inst.write(record)

    def on_jit_hook(self, kwargs: dict, *, post: bool) -> None:
        compile_info = kwargs.get("compile") or {}
        signature = compile_info.get("signature")
        if post:
            if signature is not None:
                self.drop_pending(signature)
            return
        phase = self.inst.phase().phase
        self.inst.measure(lambda m: m.specialization(phase))
        if signature is None:
            return
        fn_info = kwargs.get("fn")
        self.put_pending({
            "signature_obj": signature,
            "jit_fn": getattr(fn_info, "jit_function", None),
            "module": getattr(fn_info, "module", None),
            "qualname": getattr(fn_info, "name", None),
            "key": kwargs.get("key"),
            "repr": kwargs.get("repr"),
            "is_manual_warmup": kwargs.get("is_manual_warmup"),
            "compile": compile_info,
        })

    def on_load_start(self, name: str | None, hash_: str) -> None:
        state = self.inst.phase()
        free = _free_device_bytes()
        self.inst.measure(lambda m: m.kernel_load(state.phase, free))
        self._load_starts[(threading.get_ident(), str(hash_))] = (time.perf_counter(), free)
        while len(self._load_starts) > _MAX_LOAD_STARTS:
            self._load_starts.popitem(last=False)
        if state.phase == "serving":
            logger.warning("sglang-warmup: Triton kernel %s loaded onto the device during "
                           "serving (free device memory: %s)", name,
                           f"{free / 2**30:.2f} GiB" if free is not None else "unknown")

    def on_load_end(self, name: str | None, hash_: str) -> None:
        start = self._load_starts.pop((threading.get_ident(), str(hash_)), None)
        if self.inst.log is None:
            return
        record = self.inst.new_record(compile_log.LOAD, self.inst.phase(), compile_log.TRITON)
        record.update({
            "kernel": {"module": None, "name": name, "qualname": None},
            "hash": hash_,
            "duration_s": (time.perf_counter() - start[0]) if start is not None else None,
            "free_bytes": start[1] if start is not None else None,
        })
        self.inst.write(record)


# --------------------------------------------------------------------------------------------
# hook factories (each returns a function the host calls; each never raises on our account)
# --------------------------------------------------------------------------------------------

def _make_listener(hooks: TritonHooks, prev: Any) -> Callable[..., None]:
    # Triton calls the listener with keywords only (src, metadata, metadata_group, times,
    # cache_hit); whatever it passes is forwarded unchanged, so a signature change in a
    # future Triton cannot make our wrapper raise.
    inst = hooks.inst

    def sglang_warmup_compilation_listener(*args, **kwargs):
        try:
            if prev is not None:
                prev(*args, **kwargs)
        finally:
            if inst.active:
                try:
                    hooks.on_compile(kwargs.get("src"), kwargs.get("metadata"),
                                     kwargs.get("metadata_group"), kwargs.get("times"),
                                     bool(kwargs.get("cache_hit")))
                except Exception as exc:  # a guest never raises into Triton: counted, logged
                    inst.failed("compilation_listener", exc)

    _mark_prev(sglang_warmup_compilation_listener, prev)
    return sglang_warmup_compilation_listener


def _make_jit_hook(hooks: TritonHooks, prev: Any, *, post: bool) -> Callable[..., Any]:
    hook_name = "jit_post_compile_hook" if post else "jit_cache_hook"
    inst = hooks.inst

    def sglang_warmup_jit_hook(**kwargs):
        result = None
        try:
            if prev is not None:
                result = prev(**kwargs)
        finally:
            # A truthy jit_cache_hook result skips the compile: nothing to join then.
            if inst.active and not (result and not post):
                try:
                    hooks.on_jit_hook(kwargs, post=post)
                except Exception as exc:  # a guest never raises into Triton: counted, logged
                    inst.failed(hook_name, exc)
        return result  # the previous hook's result, never ours

    sglang_warmup_jit_hook.__name__ = f"sglang_warmup_{hook_name}"
    _mark_prev(sglang_warmup_jit_hook, prev)
    return sglang_warmup_jit_hook


def _make_load_hook(hooks: TritonHooks, *, end: bool) -> Callable[..., None]:
    hook_name = "kernel_load_end_hook" if end else "kernel_load_start_hook"
    inst = hooks.inst

    def sglang_warmup_load_hook(*args, **kwargs):
        # Triton calls hook(module, function, name, metadata_group, hash).
        if not inst.active:
            return
        try:
            name = args[2] if len(args) > 2 else kwargs.get("name")
            hash = args[4] if len(args) > 4 else kwargs.get("hash")
            if hash is None:
                raise ValueError(f"{hook_name} called without a kernel hash")
            if end:
                hooks.on_load_end(name, hash)
            else:
                hooks.on_load_start(name, hash)
        except Exception as exc:  # a guest never raises into Triton's kernel load: counted, logged
            inst.failed(hook_name, exc)

    sglang_warmup_load_hook.__name__ = f"sglang_warmup_{hook_name}"
    return sglang_warmup_load_hook


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------

def _free_device_bytes() -> float | None:
    """Free device memory in bytes, only when this process has already initialised CUDA
    (querying would otherwise create a CUDA context, which costs memory on every rank)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        free, _total = torch.cuda.mem_get_info()
        return float(free)
    except Exception:  # a guest in a kernel load: CUDA's refusal (any kind) is no number
        return None


def _get_knob(group: str, attr: str) -> Any:
    try:
        from triton import knobs

        return getattr(getattr(knobs, group), attr)
    except (ImportError, AttributeError):  # no Triton, or one without that knob
        return None


def _mark_prev(wrapper: Callable[..., Any], prev: Any) -> None:
    """Record on ``wrapper`` the hook it wraps (``_sglang_warmup_prev``: what _restore_slot
    puts back, what _slot_position follows); through ``__dict__``, as mypy types no attribute
    set on a function."""
    wrapper.__dict__["_sglang_warmup_prev"] = prev


def _restore_slot(owner: Any, attr: str, wrapper: Any) -> None:
    """Put back what our wrapper wrapped, if our wrapper is still on top of the slot."""
    current: Any = getattr(owner, attr, None)   # Any, not Any | None: `is` narrows wrapper to it
    if current is wrapper:
        setattr(owner, attr, wrapper._sglang_warmup_prev)


def _slot_position(current: Any, ours: Any) -> str:
    """Where our wrapper sits in a single-slot hook now."""
    if current is ours:
        return "ours on top"
    watch = sys.modules.get("sglang.srt.utils.triton_load_watch")
    if watch is not None and current is getattr(watch, "_on_compilation", object()) \
            and getattr(watch, "_prev_compile_listener", None) is ours:
        return "chained by sglang.srt.utils.triton_load_watch"
    prev = getattr(current, "_sglang_warmup_prev", None)
    if prev is ours:
        return "chained by another sglang-warmup wrapper"
    return f"displaced by {_describe(current)} (ours is reached only if it chains)"


def _describe(fn: Any) -> str:
    if fn is None:
        return "nothing"
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{name}"
