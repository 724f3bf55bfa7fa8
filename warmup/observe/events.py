"""Compile, load and JIT-build events from Triton and SGLang's nvcc JIT, through chained hooks.

``install()`` puts sglang-warmup's recorders on every hook the installed Triton and SGLang
offer, in the process it runs in (the plugin calls it first thing in every SGLang process):

* ``triton.knobs.compilation.listener`` (single slot): a real compile (``cache_hit=False``,
  with stage times) or a load from the disk cache (``cache_hit=True``);
* ``triton.knobs.runtime.jit_cache_hook`` / ``jit_post_compile_hook`` (single slots): the first
  use of a specialization in this process; the record it carries (module, name, specialization
  data) is joined with the listener call of the same compile;
* ``triton.knobs.runtime.kernel_load_start_hook`` / ``kernel_load_end_hook`` (chains): a
  kernel's device load at its first launch, with free device memory when CUDA is initialised;
* SGLang's nvcc JIT: in 0.5.22+ the module attributes ``...jit.utils.compile.ninja.build``
  (timed builds) and ``...compile.cache.find_prebuilt`` (cache hits); in 0.5.17 the module
  attribute ``...jit.utils.compile.load_jit`` plus ``tvm_ffi.cpp.extension.build_ninja``.  They
  are patched when their modules get imported (a post-import hook), so nothing heavy is
  imported here.

Single slots are wrapped, never replaced: our wrapper calls the previous hook, returns its
result, and records after it.  A hook installed later that chains (SGLang's
``triton_load_watch.install()``) keeps calling ours.  Recording never raises into the host: a
failure is logged and counted in ``sglang_warmup_hook_errors_total``.

Every Triton miss becomes one line of the compile log (:mod:`cache_tools.compile_log`) with
what a later rebuild on a CPU machine needs; disk hits, device loads and JIT builds are recorded
there too (field ``event``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from cache_tools import compile_log
from warmup.observe import importer
from warmup.observe import phase as _phase

logger = logging.getLogger("sglang_warmup.events")


# SGLang nvcc JIT modules, by release layout.
_NINJA_MODULE = "sglang.kernels.jit.utils.compile.ninja"      # 0.5.22+ (compile/ is a package)
_CACHE_MODULE = "sglang.kernels.jit.utils.compile.cache"      # 0.5.22+
_COMPILE_MODULE = "sglang.kernels.jit.utils.compile"          # 0.5.17 (compile.py, load_jit)
_UTILS_MODULE = "sglang.kernels.jit.utils"                    # 0.5.17 re-export of load_jit
_TVM_EXTENSION_MODULE = "tvm_ffi.cpp.extension"               # tvm-ffi's ninja runner

# Pending jit_cache_hook records waiting for their listener call; bounded so that compiles
# that fail (no listener call) cannot grow it.
_MAX_PENDING = 256
_MAX_LOAD_STARTS = 1024
# Our own failures are logged at WARNING this many times per process, then at DEBUG.
_MAX_ERROR_LOGS = 5
# A kernel module made at run time (Inductor's generated kernels) is copied into its compile-log
# lines so that replay can rebuild it elsewhere; larger sources are left out.
_MAX_SOURCE_BYTES = 256 * 1024


@dataclass(frozen=True)
class HookStatus:
    """One hook point: ``name`` (where it lives), ``state`` and a human ``detail``.

    ``state``: ``installed`` (ours, nothing was there), ``chained`` (ours, wrapping what was
    there), ``armed`` (its module is not imported yet; patched on import), ``missing`` (this
    Triton/SGLang has no such hook) or ``failed`` (installing raised; see detail).
    """

    name: str
    state: str
    detail: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class InstallReport:
    """What ``install()`` found and did.

    ``already_installed``: True when an earlier ``install()`` in this process did the work and
    this call changed nothing.  ``state_dir``: where the phase file and the compile log live
    (None: phase in-process only, no compile log).  ``multiprocess_dir``: the Prometheus
    multiprocess directory (None: single-process metrics).
    """

    triton_version: str | None
    sglang_jit_layout: str
    hooks: tuple[HookStatus, ...]
    already_installed: bool = False
    state_dir: str | None = None
    multiprocess_dir: str | None = None

    @property
    def found(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state not in ("missing",))

    @property
    def installed(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state in ("installed", "chained", "armed"))

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state == "missing")

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state == "failed")

    def to_json(self) -> dict:
        return {
            "triton_version": self.triton_version,
            "sglang_jit_layout": self.sglang_jit_layout,
            "already_installed": self.already_installed,
            "state_dir": self.state_dir,
            "multiprocess_dir": self.multiprocess_dir,
            "hooks": [h.to_json() for h in self.hooks],
        }


# --------------------------------------------------------------------------------------------
# installation
# --------------------------------------------------------------------------------------------

_install_lock = threading.RLock()
_installation: "_Installation | None" = None
_error_logs = 0


def install(*, registry: Any = None, state_dir: str | os.PathLike | None = None) -> InstallReport:
    """Install the recorders on every hook found; idempotent; never raises.

    ``registry``: a prometheus-client CollectorRegistry for our metrics (tests pass a fresh
    one); by default the metrics go to the default registry, created on the first event.
    ``state_dir``: directory of the phase file and the compile log; by default
    ``WARMUP_STATE_DIR``.  A second call returns the first call's report with
    ``already_installed=True`` (call ``uninstall()`` first to change the arguments).
    """
    global _installation
    with _install_lock:
        if _installation is not None:
            return dataclasses.replace(_installation.report, already_installed=True)
        inst = None
        try:
            inst = _Installation(registry=registry, state_dir=state_dir)
            inst.install()
        except Exception as exc:  # a guest never raises into its host
            if inst is not None:
                inst.uninstall()  # take off whatever got placed before the failure
            logger.warning("sglang-warmup: compile-event hooks not installed: %s", exc)
            return InstallReport(triton_version=None, sglang_jit_layout="unknown",
                                 hooks=(HookStatus("events", "failed", repr(exc)),))
        _installation = inst
        return inst.report


def uninstall() -> None:
    """Take our recorders off every hook (for tests).

    A single-slot hook that someone wrapped after us cannot be taken out of their chain; our
    wrapper there turns into a pass-through that only calls the hook it wrapped.
    """
    global _installation
    with _install_lock:
        inst = _installation
        _installation = None
        if inst is not None:
            inst.uninstall()


def installed() -> bool:
    """True while an installation is active in this process."""
    return _installation is not None


def status() -> InstallReport | None:
    """The active installation's report, with the current position of our single-slot hooks
    (ours on top, chained by SGLang's ``triton_load_watch``, or displaced); None when not
    installed."""
    inst = _installation
    if inst is None:
        return None
    return inst.current_report()


class _Installation:
    """One active set of recorders: the hooks it placed and the state they share."""

    def __init__(self, *, registry: Any, state_dir: str | os.PathLike | None) -> None:
        self.active = True
        self._metrics = None
        if registry is not None:
            from warmup.observe.metrics import for_registry

            self._metrics = for_registry(registry)
        resolved = _phase.resolve_state_dir(state_dir)
        self.state_dir: Path | None = resolved
        self.log = (compile_log.Writer(compile_log.directory(resolved), default=_json_default)
                    if resolved is not None else None)
        self._pending: "OrderedDict[int, dict]" = OrderedDict()
        self._pending_lock = threading.Lock()
        self._load_starts: "OrderedDict[tuple[int, str], tuple[float, float | None]]" = OrderedDict()
        self._tls = threading.local()
        self._options_fields: dict[tuple, frozenset[str]] = {}
        self._undo: list[Callable[[], None]] = []
        self.report: InstallReport = InstallReport(None, "unknown", ())
        self._hooks: list[HookStatus] = []
        self._listener = None
        self._jit_hooks: dict[str, Any] = {}

    # --- plumbing ---------------------------------------------------------------------------
    @property
    def metrics(self):
        if self._metrics is None:
            from warmup.observe import metrics

            self._metrics = metrics.default()
        return self._metrics

    def phase(self) -> _phase.PhaseState:
        return _phase.current(state_dir=self.state_dir)

    def failed(self, hook: str, exc: BaseException) -> None:
        """Log and count a failure of our own recording; never raises."""
        global _error_logs
        try:
            _error_logs += 1
            log = logger.warning if _error_logs <= _MAX_ERROR_LOGS else logger.debug
            log("sglang-warmup: recording in %s failed (the host call went on): %r", hook, exc)
            self.metrics.hook_error(hook)
        except Exception:
            pass

    def write(self, record: dict) -> None:
        if self.log is None:
            return
        try:
            self.log.write(record)
        except Exception as exc:
            self.failed("compile_log", exc)

    # --- install / uninstall ----------------------------------------------------------------
    def install(self) -> None:
        triton_version = self._install_triton()
        layout = self._install_sglang_jit()
        from warmup.observe import metrics

        self.report = InstallReport(
            triton_version=triton_version,
            sglang_jit_layout=layout,
            hooks=tuple(self._hooks),
            state_dir=str(self.state_dir) if self.state_dir is not None else None,
            multiprocess_dir=metrics.multiprocess_dir() or None,
        )

    def uninstall(self) -> None:
        self.active = False
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as exc:
                logger.debug("sglang-warmup: uninstall step failed: %r", exc)
        self._undo.clear()
        if self.log is not None:
            self.log.close()

    def current_report(self) -> InstallReport:
        hooks = []
        for h in self.report.hooks:
            if h.name == "triton.knobs.compilation.listener" and self._listener is not None:
                hooks.append(HookStatus(h.name, h.state, _slot_position(
                    _get_knob("compilation", "listener"), self._listener)))
            elif h.name.startswith("triton.knobs.runtime.jit_") and h.name in self._jit_hooks:
                attr = h.name.rsplit(".", 1)[1]
                hooks.append(HookStatus(h.name, h.state, _slot_position(
                    _get_knob("runtime", attr), self._jit_hooks[h.name])))
            elif h.state == "armed":
                module = h.name.rsplit(".", 1)[0]
                now = "patched" if module in sys.modules else "not imported yet"
                hooks.append(HookStatus(h.name, h.state, now))
            else:
                hooks.append(h)
        return dataclasses.replace(self.report, hooks=tuple(hooks))

    def _add(self, name: str, state: str, detail: str = "") -> None:
        self._hooks.append(HookStatus(name, state, detail))

    # --- Triton -----------------------------------------------------------------------------
    def _install_triton(self) -> str | None:
        names = ("triton.knobs.compilation.listener", "triton.knobs.runtime.jit_cache_hook",
                 "triton.knobs.runtime.jit_post_compile_hook",
                 "triton.knobs.runtime.kernel_load_start_hook",
                 "triton.knobs.runtime.kernel_load_end_hook")
        try:
            import triton
            from triton import knobs
        except Exception as exc:  # no Triton, or one without knobs (< 3.3)
            for name in names:
                self._add(name, "missing", f"triton.knobs not importable: {exc}")
            return _dist_version("triton")
        version = getattr(triton, "__version__", None)
        compilation = getattr(knobs, "compilation", None)
        runtime = getattr(knobs, "runtime", None)

        # compilation listener (single slot)
        name = names[0]
        if compilation is None or not hasattr(compilation, "listener"):
            self._add(name, "missing", "this Triton has no compilation listener")
        else:
            try:
                prev = compilation.listener
                wrapper = _make_listener(self, prev)
                compilation.listener = wrapper
                self._listener = wrapper
                self._undo.append(functools.partial(_restore_slot, compilation, "listener",
                                                    wrapper))
                self._add(name, "chained" if prev is not None else "installed",
                          f"wraps {_describe(prev)}" if prev is not None else "")
            except Exception as exc:
                self._add(name, "failed", repr(exc))

        # jit_cache_hook / jit_post_compile_hook (single slots)
        for name, attr, post in ((names[1], "jit_cache_hook", False),
                                 (names[2], "jit_post_compile_hook", True)):
            if runtime is None or not hasattr(runtime, attr):
                self._add(name, "missing", f"this Triton has no {attr}")
                continue
            try:
                prev = getattr(runtime, attr)
                wrapper = _make_jit_hook(self, prev, post=post)
                setattr(runtime, attr, wrapper)
                self._jit_hooks[name] = wrapper
                self._undo.append(functools.partial(_restore_slot, runtime, attr, wrapper))
                self._add(name, "chained" if prev is not None else "installed",
                          f"wraps {_describe(prev)}" if prev is not None else "")
            except Exception as exc:
                self._add(name, "failed", repr(exc))

        # kernel load chains
        for name, attr, end in ((names[3], "kernel_load_start_hook", False),
                                (names[4], "kernel_load_end_hook", True)):
            chain = getattr(runtime, attr, None) if runtime is not None else None
            if chain is None or not hasattr(chain, "add"):
                self._add(name, "missing", f"this Triton has no {attr} chain")
                continue
            try:
                fn = _make_load_hook(self, end=end)
                chain.add(fn)
                self._undo.append(functools.partial(chain.remove, fn))
                others = [c for c in getattr(chain, "calls", ()) if c is not fn]
                self._add(name, "chained" if others else "installed",
                          f"alongside {', '.join(_describe(c) for c in others)}" if others else "")
            except Exception as exc:
                self._add(name, "failed", repr(exc))
        return version

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

    def count(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Call one recording method of our metrics; a failure is counted, not raised."""
        try:
            getattr(self.metrics, method)(*args, **kwargs)
        except Exception as exc:
            self.failed("metrics", exc)

    def on_compile(self, src, metadata, metadata_group, times, cache_hit) -> None:
        """Record one listener call: metrics, log line and compile-log line."""
        if src is None or metadata is None:
            raise ValueError("compilation listener called without src/metadata")
        pending = self.take_pending(src)
        state = self.phase()
        duration = (times.total / 1e6) if times is not None else None
        outcome = "hit" if cache_hit else "miss"
        self.count("compile_event", state.phase, "triton", outcome,
                   duration if not cache_hit else None)
        name = getattr(src, "name", "?")
        if not cache_hit:
            log = logger.warning if state.phase == "serving" else logger.debug
            log("sglang-warmup: Triton compiled %s in %.3f s (phase %s)", name, duration or 0.0,
                state.phase)
        if self.log is not None:
            try:
                record = _triton_record(self, "hit" if cache_hit else "miss", state, src,
                                        metadata, metadata_group, times, pending)
            except Exception as exc:
                self.failed("compile_log", exc)
                return
            self.write(record)

    def on_jit_hook(self, kwargs: dict, *, post: bool) -> None:
        compile_info = kwargs.get("compile") or {}
        signature = compile_info.get("signature")
        if post:
            if signature is not None:
                self.drop_pending(signature)
            return
        self.count("specialization", self.phase().phase)
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

    def on_load_start(self, name: str, hash_: str) -> None:
        state = self.phase()
        free = _free_device_bytes()
        self.count("kernel_load", state.phase, free)
        key = (threading.get_ident(), str(hash_))
        self._load_starts[key] = (time.perf_counter(), free)
        while len(self._load_starts) > _MAX_LOAD_STARTS:
            self._load_starts.popitem(last=False)
        if state.phase == "serving":
            logger.warning("sglang-warmup: Triton kernel %s loaded onto the device during "
                           "serving (free device memory: %s)", name,
                           f"{free / 2**30:.2f} GiB" if free is not None else "unknown")

    def on_load_end(self, name: str, hash_: str) -> None:
        start = self._load_starts.pop((threading.get_ident(), str(hash_)), None)
        if self.log is None:
            return
        state = self.phase()
        record = _base_record("load", state, "triton")
        record.update({
            "kernel": {"module": None, "name": name, "qualname": None},
            "hash": hash_,
            "duration_s": (time.perf_counter() - start[0]) if start is not None else None,
            "free_bytes": start[1] if start is not None else None,
        })
        self.write(record)

    # --- SGLang nvcc JIT --------------------------------------------------------------------
    def _install_sglang_jit(self) -> str:
        layout = _sglang_jit_layout()
        targets: list[tuple[str, str, Callable[[_Installation, Any], Any]]] = []
        if layout == "package":
            targets += [(_NINJA_MODULE, "build", _wrap_ninja_build),
                        (_CACHE_MODULE, "find_prebuilt", _wrap_find_prebuilt)]
        elif layout == "module":
            targets += [(_COMPILE_MODULE, "load_jit", _wrap_load_jit)]
        else:
            self._add(f"{_NINJA_MODULE}.build", "missing",
                      "no sglang.kernels.jit in the installed SGLang" if layout == "none"
                      else "SGLang is not installed")
        targets.append((_TVM_EXTENSION_MODULE, "build_ninja", _wrap_tvm_build_ninja))

        for module_name, attr, make in targets:
            name = f"{module_name}.{attr}"
            if module_name == _TVM_EXTENSION_MODULE and not _module_exists("tvm_ffi"):
                self._add(name, "missing", "tvm_ffi is not installed")
                continue
            module = sys.modules.get(module_name)
            if module is not None:
                try:
                    detail = self._patch(module, attr, make)
                    self._add(name, "installed", detail)
                except Exception as exc:
                    self._add(name, "failed", repr(exc))
                continue
            try:
                self._undo.append(importer.finder().watch(
                    module_name, functools.partial(self._patch_on_import, attr, make)))
                self._add(name, "armed", "patched when the module is imported")
            except Exception as exc:
                self._add(name, "failed", repr(exc))
        return layout

    def _patch_on_import(self, attr: str, make: Callable, module: Any) -> None:
        if not self.active:
            return
        try:
            self._patch(module, attr, make)
        except Exception as exc:
            self.failed("sglang_jit", exc)

    def _patch(self, module: Any, attr: str, make: Callable) -> str:
        """Replace ``module.attr`` by our wrapper (once); return a detail line."""
        original = getattr(module, attr, None)
        if original is None:
            raise AttributeError(f"{module.__name__} has no attribute {attr}")
        if getattr(original, "_sglang_warmup_wrapped", None) is not None:
            return "already wrapped"
        wrapper = make(self, original)
        wrapper._sglang_warmup_wrapped = original
        setattr(module, attr, wrapper)
        self._undo.append(functools.partial(_restore_attr, module, attr, wrapper, original))
        detail = ""
        if module.__name__ == _COMPILE_MODULE and attr == "load_jit":
            # 0.5.17: callers bind load_jit by name at their import; those imported before
            # us keep the original.  Re-point the package's re-export too.
            utils = sys.modules.get(_UTILS_MODULE)
            if utils is not None and getattr(utils, "load_jit", None) is original:
                setattr(utils, "load_jit", wrapper)
                self._undo.append(functools.partial(_restore_attr, utils, "load_jit", wrapper,
                                                    original))
                detail = ("patched after import: kernels that imported load_jit earlier "
                          "are not observed")
        return detail

    def on_jit_build(self, *, compiler: str, outcome: str, module_name: str | None,
                     duration_s: float | None, path: str | None = None,
                     error: str | None = None) -> None:
        state = self.phase()
        self.count("jit_build", state.phase, outcome, duration_s, compiler=compiler)
        if outcome != "hit":
            log = logger.warning if state.phase == "serving" or outcome == "failed" \
                else logger.debug
            log("sglang-warmup: JIT module %s %s in %.3f s (phase %s)", module_name, outcome,
                duration_s or 0.0, state.phase)
        record = _base_record("jit_build", state, compiler)
        record.update({"outcome": outcome, "module_name": module_name, "duration_s": duration_s,
                       "path": path, "cache_hit": outcome == "hit"})
        if error is not None:
            record["error"] = error
        self.write(record)


# --------------------------------------------------------------------------------------------
# hook factories (each returns a function the host calls; each never raises on our account)
# --------------------------------------------------------------------------------------------

def _make_listener(inst: _Installation, prev: Any) -> Callable[..., None]:
    # Triton calls the listener with keywords only (src, metadata, metadata_group, times,
    # cache_hit); whatever it passes is forwarded unchanged, so a signature change in a
    # future Triton cannot make our wrapper raise.
    def sglang_warmup_compilation_listener(*args, **kwargs):
        try:
            if prev is not None:
                prev(*args, **kwargs)
        finally:
            if inst.active:
                try:
                    inst.on_compile(kwargs.get("src"), kwargs.get("metadata"),
                                    kwargs.get("metadata_group"), kwargs.get("times"),
                                    bool(kwargs.get("cache_hit")))
                except Exception as exc:
                    inst.failed("compilation_listener", exc)

    sglang_warmup_compilation_listener._sglang_warmup_prev = prev
    return sglang_warmup_compilation_listener


def _make_jit_hook(inst: _Installation, prev: Any, *, post: bool) -> Callable[..., Any]:
    hook_name = "jit_post_compile_hook" if post else "jit_cache_hook"

    def sglang_warmup_jit_hook(**kwargs):
        result = None
        try:
            if prev is not None:
                result = prev(**kwargs)
        finally:
            # A truthy jit_cache_hook result skips the compile: nothing to join then.
            if inst.active and not (result and not post):
                try:
                    inst.on_jit_hook(kwargs, post=post)
                except Exception as exc:
                    inst.failed(hook_name, exc)
        return result  # the previous hook's result, never ours

    sglang_warmup_jit_hook.__name__ = f"sglang_warmup_{hook_name}"
    sglang_warmup_jit_hook._sglang_warmup_prev = prev
    return sglang_warmup_jit_hook


def _make_load_hook(inst: _Installation, *, end: bool) -> Callable[..., None]:
    hook_name = "kernel_load_end_hook" if end else "kernel_load_start_hook"

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
                inst.on_load_end(name, hash)
            else:
                inst.on_load_start(name, hash)
        except Exception as exc:
            inst.failed(hook_name, exc)

    sglang_warmup_load_hook.__name__ = f"sglang_warmup_{hook_name}"
    return sglang_warmup_load_hook


def _wrap_ninja_build(inst: _Installation, original: Callable) -> Callable:
    """0.5.22+: ``ninja.build(*, spec, build_dir, build_file) -> Path`` runs nvcc through ninja."""

    @functools.wraps(original)
    def build(*args, **kwargs):
        if not inst.active:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            _record_jit(inst, "failed", _spec_name(args, kwargs), time.perf_counter() - start,
                        error=f"{type(exc).__name__}: {str(exc)[:500]}")
            raise
        _record_jit(inst, "built", _spec_name(args, kwargs), time.perf_counter() - start,
                    path=str(result))
        return result

    return build


def _wrap_find_prebuilt(inst: _Installation, original: Callable) -> Callable:
    """0.5.22+: ``cache.find_prebuilt(*, scope, module_name) -> Path | None``.  Only hits are
    counted: a miss is looked up twice (before and after the build lock) and ends in a build,
    which ``ninja.build`` counts."""

    @functools.wraps(original)
    def find_prebuilt(*args, **kwargs):
        result = original(*args, **kwargs)
        if result is not None and inst.active:
            _record_jit(inst, "hit", kwargs.get("module_name"), None, path=str(result))
        return result

    return find_prebuilt


def _wrap_load_jit(inst: _Installation, original: Callable) -> Callable:
    """0.5.17: ``load_jit(*args, ...)`` either loads ``<module>.so`` from the tvm-ffi cache dir
    or builds through ``tvm_ffi.cpp.load_inline``/``load`` (whose ninja run we time).  A call
    that ran no build is a hit."""

    @functools.wraps(original)
    def load_jit(*args, **kwargs):
        if not inst.active:
            return original(*args, **kwargs)
        tls = inst._tls
        depth = getattr(tls, "load_jit_depth", 0)
        tls.load_jit_depth = depth + 1
        if depth == 0:
            tls.load_jit_built = False
        try:
            result = original(*args, **kwargs)
        finally:
            tls.load_jit_depth = depth
        if depth == 0 and not tls.load_jit_built:
            _record_jit(inst, "hit", "sgl_kernel_jit_" + "_".join(str(a) for a in args), None)
        return result

    torch = sys.modules.get("torch")
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is not None:
        # The original is torch.compiler.disable'd; keep Dynamo out of our frame as well.
        try:
            return disable(load_jit)
        except Exception:
            pass
    return load_jit


def _wrap_tvm_build_ninja(inst: _Installation, original: Callable) -> Callable:
    """tvm-ffi's ``cpp.extension.build_ninja(build_dir)``: the nvcc/c++ build of a module built
    through tvm-ffi (SGLang 0.5.17's load_jit, DeepGEMM's fallback builder)."""

    @functools.wraps(original)
    def build_ninja(*args, **kwargs):
        if not inst.active:
            return original(*args, **kwargs)
        tls = inst._tls
        inside = getattr(tls, "load_jit_depth", 0) > 0
        compiler = "sglang_jit" if inside else "tvm_ffi"
        build_dir = args[0] if args else kwargs.get("build_dir")
        module_name = Path(str(build_dir)).name if build_dir is not None else None
        start = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            _record_jit(inst, "failed", module_name, time.perf_counter() - start,
                        compiler=compiler, error=f"{type(exc).__name__}: {str(exc)[:500]}")
            raise
        if inside:
            tls.load_jit_built = True
        _record_jit(inst, "built", module_name, time.perf_counter() - start, compiler=compiler,
                    path=str(build_dir))
        return result

    return build_ninja


def _record_jit(inst: _Installation, outcome: str, module_name: str | None,
                duration_s: float | None, *, compiler: str = "sglang_jit",
                path: str | None = None, error: str | None = None) -> None:
    try:
        inst.on_jit_build(compiler=compiler, outcome=outcome, module_name=module_name,
                          duration_s=duration_s, path=path, error=error)
    except Exception as exc:
        inst.failed("sglang_jit", exc)


def _spec_name(args: tuple, kwargs: dict) -> str | None:
    spec = kwargs.get("spec", args[0] if args else None)
    try:
        return str(spec.module_name)
    except Exception:
        return None


_sources: dict[str, dict | None] = {}
_sources_lock = threading.Lock()


def generated_source(function: Any) -> dict | None:
    """The module text of a kernel defined in a module made at run time, or None.

    Inductor writes each generated kernel to a file in its cache and executes it as a module
    that has no import spec (``torch._inductor.runtime.compile_tasks.<key>``), so no other
    process can import it by name.  Its text goes into the compile-log line:
    ``{"file": basename, "sha256": hex, "text": source}``.  Modules that import normally,
    ``__main__`` scripts and sources over 256 KiB give None.  Read once per file; never
    raises."""
    try:
        namespace = getattr(function, "__globals__", None)
        if not isinstance(namespace, dict) or namespace.get("__spec__", True) is not None:
            return None
        name, path = namespace.get("__name__"), namespace.get("__file__")
        if not name or name == "__main__" or not isinstance(path, str):
            return None
        with _sources_lock:
            if path in _sources:
                return _sources[path]
        result = None
        if os.path.isfile(path) and os.path.getsize(path) <= _MAX_SOURCE_BYTES:
            text = Path(path).read_text(encoding="utf-8")
            result = {"file": os.path.basename(path),
                      "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                      "text": text}
        with _sources_lock:
            _sources[path] = result
        return result
    except Exception:
        return None


_toolchains: dict[tuple, dict | None] = {}


def _toolchain(target: Any) -> dict | None:
    """The ptxas the cache key hashed (its path and ``--version`` output, as Triton's
    ``get_ptxas_version`` read it), for a CUDA target; None otherwise.

    The version is part of the key, and it differs between processes of one server: Inductor's
    compile workers point ``TRITON_PTXAS_PATH`` at the ptxas shipped in torch, the scheduler
    uses Triton's own.  Replay needs to know which.  Never raises."""
    try:
        if target is None or getattr(target, "backend", None) != "cuda":
            return None
        arch = target.arch
        variable = "TRITON_PTXAS_BLACKWELL_PATH" if int(arch) >= 100 else "TRITON_PTXAS_PATH"
        key = (arch, os.environ.get(variable))
        if key not in _toolchains:
            from triton.backends.nvidia import compiler as nvidia

            _toolchains[key] = {"ptxas": nvidia.get_ptxas(arch).path,
                                "ptxas_version": nvidia.get_ptxas_version(arch)}
        return _toolchains[key]
    except Exception:
        return None


def _base_record(event: str, state: _phase.PhaseState, compiler: str) -> dict:
    return compile_log.record(event, phase=state.phase, shape_class=state.shape_class,
                              request=state.request, compiler=compiler)


def _triton_record(inst: _Installation, event: str, state: _phase.PhaseState, src: Any,
                   metadata: dict, metadata_group: dict | None, times: Any,
                   pending: dict | None) -> dict:
    """The compile-log line of one listener call, joined with its jit_cache_hook record."""
    fn = getattr(src, "fn", None)
    inner = getattr(fn, "fn", None)
    kernel = {
        "module": (pending or {}).get("module") or getattr(fn, "module", None)
        or getattr(inner, "__module__", None),
        "name": getattr(src, "name", None),
        "qualname": (pending or {}).get("qualname") or getattr(inner, "__qualname__", None),
    }
    if fn is None and getattr(src, "path", None) is not None:
        kernel["path"] = str(src.path)  # an IR source: replayable from that file only
    source = generated_source(inner)
    if source is not None:
        kernel["source"] = source
    metadata = dict(metadata or {})
    target = metadata.get("target")
    target_json = _target_json(target)
    options = {}
    if target is not None:
        try:
            fields = inst.options_fields(target)
            options = {k: metadata[k] for k in sorted(fields) if k in metadata}
        except Exception:
            options = {}
    env = {}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        env = {k: metadata[k] for k in get_cache_invalidating_env_vars() if k in metadata}
    except Exception:
        pass
    record = _base_record(event, state, "triton")
    record.update({
        "kernel": kernel,
        "key": None if pending is None else _jsonable(pending.get("key")),
        "hash": metadata.get("hash"),
        "signature": {str(k): _jsonable(v) for k, v in (getattr(src, "signature", None) or {}).items()},
        "constexprs": _encode_paths(getattr(src, "constants", None) or {}, fn, "value",
                                    _encode_constant),
        "attrs": _encode_paths(getattr(src, "attrs", None) or {}, fn, "attrs", _jsonable),
        "options": _jsonable(options),
        "env": _jsonable(env),
        "target": target_json,
        "toolchain": _toolchain(target),
        "triton_version": metadata.get("triton_version"),
        "duration_s": (times.total / 1e6) if times is not None else None,
        "stages": _stages(times),
        "cache_hit": event == "hit",
        # The files of the cache entry (names only) and the entry's directory name.
        "artifacts": sorted(str(k) for k in (metadata_group or {})),
        "cache_entry": _entry_dir(metadata_group),
    })
    if pending is not None:
        info = pending.get("compile") or {}
        specialization = {
            k: _jsonable(info[k]) for k in ("device", "num_warps", "num_ctas", "num_stages",
                                            "enable_fp_fusion", "launch_cooperative_grid",
                                            "extern_libs", "is_warmup", "specialization_data")
            if k in info
        }
        specialization["signature"] = {str(k): _jsonable(v)
                                       for k, v in (info.get("signature") or {}).items()}
        specialization["constants"] = _encode_paths(info.get("constants") or {}, fn, "value",
                                                    _encode_constant)
        specialization["configs"] = [_encode_paths(c, fn, "attrs", _jsonable)
                                     for c in (info.get("configs") or ())]
        specialization["repr"] = pending.get("repr")
        specialization["is_manual_warmup"] = pending.get("is_manual_warmup")
        record["specialization"] = specialization
    else:
        record["specialization"] = None
    return record


def _entry_dir(metadata_group: dict | None) -> str | None:
    for path in (metadata_group or {}).values():
        try:
            return Path(str(path)).parent.name
        except Exception:
            return None
    return None


def _stages(times: Any) -> dict | None:
    if times is None:
        return None
    try:
        return {
            "ir_initialization_s": times.ir_initialization / 1e6,
            "lowering_s": {str(name): us / 1e6 for name, us in times.lowering_stages},
            "store_results_s": times.store_results / 1e6,
        }
    except Exception:
        return None


def _encode_paths(mapping: Any, fn: Any, field: str, encode: Callable[[Any], Any]) -> list[dict]:
    """``{(path...): value}`` (Triton's constexpr/attr maps) as JSON: path, parameter name, value."""
    arg_names = getattr(fn, "arg_names", None)
    out = []
    try:
        items = sorted(mapping.items(), key=lambda kv: tuple(kv[0]) if isinstance(kv[0], tuple)
                       else (kv[0],))
    except TypeError:
        items = list(mapping.items())
    for path, value in items:
        path_list = list(path) if isinstance(path, tuple) else [path]
        entry: dict[str, Any] = {"path": path_list}
        if arg_names and path_list and isinstance(path_list[0], int) \
                and 0 <= path_list[0] < len(arg_names):
            entry["name"] = arg_names[path_list[0]]
        entry[field] = encode(value)
        out.append(entry)
    return out


def _encode_constant(value: Any) -> Any:
    """A constexpr value the way Triton's ``serialize_specialization_data`` writes it."""
    cls = value.__class__.__name__
    if cls == "dtype":
        return str(value)
    if cls == "constexpr":
        return {"constexpr": _jsonable(value.value)}
    if cls == "JITFunction":
        return {"jit_function": f"{value.module}:{value.fn.__qualname__}"}
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if value.__class__.__name__ == "GPUTarget":
        return _target_json(value)
    if isinstance(value, Path):
        return str(value)
    return {"repr": repr(value)}


def _json_default(value: Any) -> Any:
    return _jsonable(value)


def _target_json(target: Any) -> dict | None:
    if target is None:
        return None
    if isinstance(target, dict):
        return {k: target.get(k) for k in ("backend", "arch", "warp_size")}
    return {"backend": getattr(target, "backend", None), "arch": getattr(target, "arch", None),
            "warp_size": getattr(target, "warp_size", None)}


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
    except Exception:
        return None


def _get_knob(group: str, attr: str) -> Any:
    try:
        from triton import knobs

        return getattr(getattr(knobs, group), attr)
    except Exception:
        return None


def _restore_slot(owner: Any, attr: str, wrapper: Any) -> None:
    """Put back what our wrapper wrapped, if our wrapper is still on top of the slot."""
    if getattr(owner, attr, None) is wrapper:
        setattr(owner, attr, wrapper._sglang_warmup_prev)


def _restore_attr(module: Any, attr: str, wrapper: Any, original: Any) -> None:
    if getattr(module, attr, None) is wrapper:
        setattr(module, attr, original)


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


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def _module_exists(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _sglang_jit_layout() -> str:
    """Which nvcc-JIT layout the installed SGLang has, read from its files without importing
    it (``import sglang`` redirects cache variables as a side effect):

    ``package``: ``kernels/jit/utils/compile/`` with ``ninja.py``/``cache.py`` (0.5.22+);
    ``module``: ``kernels/jit/utils/compile.py`` with ``load_jit`` (0.5.17);
    ``none``: SGLang without ``kernels/jit``; ``absent``: no SGLang.
    """
    package = sys.modules.get("sglang")
    locations: list[str] = []
    if package is not None:
        locations = list(getattr(package, "__path__", []) or [])
    else:
        try:
            spec = importlib.util.find_spec("sglang")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return "absent"
        locations = list(spec.submodule_search_locations or [])
    for base in locations:
        utils = Path(base) / "kernels" / "jit" / "utils"
        if (utils / "compile" / "ninja.py").is_file() and (utils / "compile" / "cache.py").is_file():
            return "package"
        if (utils / "compile.py").is_file():
            return "module"
    return "none"
