"""SGLang's nvcc JIT builds and tvm-ffi's ninja runs, observed by wrapping their entry points.

* SGLang 0.5.22+: the module attributes ``...jit.utils.compile.ninja.build`` (timed builds)
  and ``...compile.cache.find_prebuilt`` (cache hits);
* SGLang 0.5.17: the module attribute ``...jit.utils.compile.load_jit``, a hit unless a
  build ran inside it;
* ``tvm_ffi.cpp.extension.build_ninja``: every build through tvm-ffi (0.5.17's ``load_jit``,
  DeepGEMM's fallback builder).

They are patched when their modules get imported (a post-import hook), so nothing heavy is
imported here: ``import sglang`` redirects cache variables as a side effect, so even the
release layout is read from SGLang's files, not by importing it.  Each wrapper calls the
original, returns its result or raises its error, and records after it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cache_tools import compile_log
from warmup.observe import importer
from warmup.observe.recorder import Recorder


logger = logging.getLogger("sglang_warmup.events")

# SGLang nvcc JIT modules, by release layout.
NINJA_MODULE = "sglang.kernels.jit.utils.compile.ninja"      # 0.5.22+ (compile/ is a package)
CACHE_MODULE = "sglang.kernels.jit.utils.compile.cache"      # 0.5.22+
COMPILE_MODULE = "sglang.kernels.jit.utils.compile"          # 0.5.17 (compile.py, load_jit)
UTILS_MODULE = "sglang.kernels.jit.utils"                    # 0.5.17 re-export of load_jit
TVM_EXTENSION_MODULE = "tvm_ffi.cpp.extension"               # tvm-ffi's ninja runner


class JitHooks:
    """Our wrappers around SGLang's and tvm-ffi's JIT build functions, for one installation."""

    def __init__(self, inst: Recorder) -> None:
        self.inst = inst
        # Per thread: how deep inside load_jit (0.5.17) we are, and whether a build ran there.
        self.tls = threading.local()

    def install(self) -> str:
        """Patch (or arm for import) every JIT entry point of the installed layout; returns
        the layout (``package``, ``module``, ``none`` or ``absent``)."""
        inst = self.inst
        layout = sglang_jit_layout()
        targets: list[tuple[str, str, Callable[[JitHooks, Any], Any]]] = []
        if layout == "package":
            targets += [(NINJA_MODULE, "build", _wrap_ninja_build),
                        (CACHE_MODULE, "find_prebuilt", _wrap_find_prebuilt)]
        elif layout == "module":
            targets += [(COMPILE_MODULE, "load_jit", _wrap_load_jit)]
        else:
            inst.add(f"{NINJA_MODULE}.build", "missing",
                     "no sglang.kernels.jit in the installed SGLang" if layout == "none"
                     else "SGLang is not installed")
        targets.append((TVM_EXTENSION_MODULE, "build_ninja", _wrap_tvm_build_ninja))

        for module_name, attr, make in targets:
            name = f"{module_name}.{attr}"
            if module_name == TVM_EXTENSION_MODULE and not _module_exists("tvm_ffi"):
                inst.add(name, "missing", "tvm_ffi is not installed")
                continue
            module = sys.modules.get(module_name)
            if module is not None:
                try:
                    inst.add(name, "installed", self._patch(module, attr, make))
                except Exception as exc:  # a guest: a hook it cannot place is reported, not raised
                    inst.add(name, "failed", repr(exc))
                continue
            try:
                inst.on_uninstall(importer.finder().watch(
                    module_name, functools.partial(self._patch_on_import, attr, make)))
                inst.add(name, "armed", "patched when the module is imported")
            except Exception as exc:  # a guest: a hook it cannot place is reported, not raised
                inst.add(name, "failed", repr(exc))
        return layout

    def _patch_on_import(self, attr: str, make: Callable, module: Any) -> None:
        if not self.inst.active:
            return
        try:
            self._patch(module, attr, make)
        except Exception as exc:  # a guest never raises into its host's import: counted, logged
            self.inst.failed("sglang_jit", exc)

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
        self.inst.on_uninstall(functools.partial(_restore_attr, module, attr, wrapper, original))
        detail = ""
        if module.__name__ == COMPILE_MODULE and attr == "load_jit":
            # 0.5.17: callers bind load_jit by name at their import; those imported before
            # us keep the original.  Re-point the package's re-export too.
            utils: Any = sys.modules.get(UTILS_MODULE)     # SGLang's jit_kernel.utils, untyped
            if utils is not None and getattr(utils, "load_jit", None) is original:
                utils.load_jit = wrapper
                self.inst.on_uninstall(functools.partial(_restore_attr, utils, "load_jit",
                                                         wrapper, original))
                detail = ("patched after import: kernels that imported load_jit earlier "
                          "are not observed")
        return detail

    def record(self, outcome: str, module_name: str | None, duration_s: float | None, *,
               compiler: str = "sglang_jit", path: str | None = None,
               error: str | None = None) -> None:
        """One JIT build, counted and written by the installation."""
        self.inst.build(outcome, module_name, duration_s, compiler=compiler, path=path,
                        error=error)


# --------------------------------------------------------------------------------------------
# wrappers (each calls the original first and returns or raises what it did)
# --------------------------------------------------------------------------------------------

def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def _wrap_ninja_build(hooks: JitHooks, original: Callable) -> Callable:
    """0.5.22+: ``ninja.build(*, spec, build_dir, build_file) -> Path`` runs nvcc through ninja."""

    @functools.wraps(original)
    def build(*args, **kwargs):
        if not hooks.inst.active:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:  # the host's own failure: recorded, then raised as it was
            hooks.record(compile_log.FAILED, _spec_name(args, kwargs), time.perf_counter() - start,
                         error=_error(exc))
            raise
        hooks.record(compile_log.BUILT, _spec_name(args, kwargs), time.perf_counter() - start,
                     path=str(result))
        return result

    return build


def _wrap_find_prebuilt(hooks: JitHooks, original: Callable) -> Callable:
    """0.5.22+: ``cache.find_prebuilt(*, scope, module_name) -> Path | None``.  Only hits are
    counted: a miss is looked up twice (before and after the build lock) and ends in a build,
    which ``ninja.build`` counts."""

    @functools.wraps(original)
    def find_prebuilt(*args, **kwargs):
        result = original(*args, **kwargs)
        if result is not None and hooks.inst.active:
            hooks.record(compile_log.CACHED, kwargs.get("module_name"), None, path=str(result))
        return result

    return find_prebuilt


def _wrap_load_jit(hooks: JitHooks, original: Callable) -> Callable:
    """0.5.17: ``load_jit(*args, ...)`` either loads ``<module>.so`` from the tvm-ffi cache dir
    or builds through ``tvm_ffi.cpp.load_inline``/``load`` (whose ninja run we time).  A call
    that ran no build is a hit."""

    @functools.wraps(original)
    def load_jit(*args, **kwargs):
        if not hooks.inst.active:
            return original(*args, **kwargs)
        tls = hooks.tls
        depth = getattr(tls, "load_jit_depth", 0)
        tls.load_jit_depth = depth + 1
        if depth == 0:
            tls.load_jit_built = False
        try:
            result = original(*args, **kwargs)
        finally:
            tls.load_jit_depth = depth
        if depth == 0 and not tls.load_jit_built:
            hooks.record(compile_log.CACHED, "sgl_kernel_jit_" + "_".join(str(a) for a in args), None)
        return result

    torch = sys.modules.get("torch")
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is not None:
        # The original is torch.compiler.disable'd; keep Dynamo out of our frame as well.
        try:
            return disable(load_jit)
        except Exception as exc:  # a torch that refuses: Dynamo may trace our frame, no worse
            logger.debug("sglang-warmup: torch.compiler.disable refused load_jit: %r", exc)
    return load_jit


def _wrap_tvm_build_ninja(hooks: JitHooks, original: Callable) -> Callable:
    """tvm-ffi's ``cpp.extension.build_ninja(build_dir)``: the nvcc/c++ build of a module built
    through tvm-ffi (SGLang 0.5.17's load_jit, DeepGEMM's fallback builder)."""

    @functools.wraps(original)
    def build_ninja(*args, **kwargs):
        if not hooks.inst.active:
            return original(*args, **kwargs)
        tls = hooks.tls
        inside = getattr(tls, "load_jit_depth", 0) > 0
        compiler = "sglang_jit" if inside else "tvm_ffi"
        build_dir = args[0] if args else kwargs.get("build_dir")
        module_name = Path(str(build_dir)).name if build_dir is not None else None
        start = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:  # the host's own failure: recorded, then raised as it was
            hooks.record(compile_log.FAILED, module_name, time.perf_counter() - start,
                         compiler=compiler, error=_error(exc))
            raise
        if inside:
            tls.load_jit_built = True
        hooks.record(compile_log.BUILT, module_name, time.perf_counter() - start, compiler=compiler,
                     path=str(build_dir))
        return result

    return build_ninja


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------

def _spec_name(args: tuple, kwargs: dict) -> str | None:
    spec = kwargs.get("spec", args[0] if args else None)
    if spec is None:
        return None
    try:
        return str(spec.module_name)
    except AttributeError:  # another release's spec, or none: the build is unnamed
        return None


def _restore_attr(module: Any, attr: str, wrapper: Any, original: Any) -> None:
    if getattr(module, attr, None) is wrapper:
        setattr(module, attr, original)


def _module_exists(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def sglang_jit_layout() -> str:
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
