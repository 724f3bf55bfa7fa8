"""The Triton worker of a replay: rebuild one recorded cache entry, and only under its own key.

For one compile-log record: resolve the kernel (import its module, or execute the module text
the record carries), rebuild the ``ASTSource`` and options, choose the ptxas that prints the
recorded version, recompute the cache key the way ``triton.compile`` does and compile only when
it equals the recorded one.  Runs in the replaying process (``--jobs 1``) or in a worker
process; Triton and the kernels are imported here, lazily, so the package stays
standard-library-only at import.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from cache_tools import locations
from cache_tools.replay.report import (COMPILE_ERROR, EXTERN_LIB, FAILED, KEY_MISMATCH,
                                       MISSING_FIELDS, NOT_A_KERNEL, NOT_IMPORTABLE, PLANNED,
                                       PRESENT, PTXAS_VERSION, REBUILT, SKIPPED, TRITON_VERSION)
from cache_tools.replay.toolchain import Toolchain, ptxas_version_scope

# Cache-manager overrides that would send our writes somewhere other than the cache dir.
_MANAGER_VARS = ("TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND")


def cache_environment(cache_dir: str) -> dict[str, str | None]:
    """The variables that make Triton's file cache manager write into ``cache_dir``."""
    values: dict[str, str | None] = {v: None for v in _MANAGER_VARS}
    values[locations.kind("triton").variables[0]] = cache_dir
    return values


# --------------------------------------------------------------------------------------------
# resolving the kernel
# --------------------------------------------------------------------------------------------

_source_dir: Path | None = None


def recorded_source_dir() -> Path:
    """A private directory of this process for recorded kernel modules (removed at exit).
    Made before workers are forked, so that the process that removes it is the one that
    made it."""
    global _source_dir
    if _source_dir is None:
        _source_dir = Path(tempfile.mkdtemp(prefix="sglang-warmup-replay-src-"))
        atexit.register(shutil.rmtree, _source_dir, True)
    return _source_dir


@contextlib.contextmanager
def _without_gpu_driver_setup(text: str) -> Iterator[None]:
    """Inductor's generated modules select the GPU driver when executed
    (``triton_helpers.set_driver_to_gpu()``), which raises on a machine without a GPU; the
    compile needs no driver.  Newer torch has a switch for exactly this; older torch gets
    the call made a no-op while the module executes."""
    if "triton_helpers" not in text:
        yield
        return
    try:
        from torch._inductor.runtime import triton_helpers
    except Exception:  # the module's own import will say what is missing
        yield
        return
    skip = getattr(triton_helpers, "skip_gpu_driver_setup", None)
    if skip is not None:
        with skip():
            yield
        return
    original = getattr(triton_helpers, "set_driver_to_gpu", None)
    if original is None:
        yield
        return
    triton_helpers.set_driver_to_gpu = lambda: None
    try:
        yield
    finally:
        triton_helpers.set_driver_to_gpu = original


def _load_recorded_source(module_name: str, source: dict) -> Any:
    """Execute a kernel module from the text its compile-log line carries (a module that was
    made at run time, such as Inductor's generated kernels), as Inductor itself loads it:
    a module of the recorded name with ``__file__`` set, registered in ``sys.modules``."""
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        return loaded
    text = source.get("text")
    if not isinstance(text, str):
        raise LookupError(NOT_IMPORTABLE, f"{module_name} was made at run time and its "
                                          "compile-log line carries no source text")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != source.get("sha256"):
        raise LookupError(NOT_IMPORTABLE, f"the source recorded for {module_name} does not "
                                          "match its sha256: the compile-log line is damaged")
    name = str(source.get("file") or "")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py", name):
        name = f"{digest[:32]}.py"
    path = recorded_source_dir() / digest[:16] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    try:
        code = compile(text, str(path), "exec", dont_inherit=True)
        with _without_gpu_driver_setup(text):
            exec(code, module.__dict__, module.__dict__)
    except BaseException as exc:  # generated code may raise anything
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        raise LookupError(NOT_IMPORTABLE, f"the recorded source of {module_name} does not run "
                                          f"here: {type(exc).__name__}: {first}") from None
    sys.modules[module_name] = module
    return module


def _resolve_kernel(module_name: str, qualname: str,
                    source: dict | None = None) -> tuple[Any, Any]:
    """(the JITFunction, the Autotuner around it or None) for ``module:qualname``; a module
    made at run time is executed from its recorded ``source``.

    Raises LookupError (with the sentence to report) when it cannot be found."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction, KernelInterface

    if isinstance(source, dict):
        obj = _load_recorded_source(module_name, source)
    else:
        try:
            obj = importlib.import_module(module_name)
        except BaseException as exc:  # a module may exit or raise anything on import
            if isinstance(exc, KeyboardInterrupt):
                raise
            first = (str(exc).splitlines() or [""])[0][:300]
            raise LookupError(NOT_IMPORTABLE, f"import {module_name} failed: "
                                              f"{type(exc).__name__}: {first}") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise LookupError(NOT_IMPORTABLE,
                              f"{module_name} has no {qualname} (a different release of its "
                              "package than recorded?)")
        obj = getattr(obj, part)
    autotuner = None
    # Unwrap @triton.autotune / @triton.heuristics down to the JITFunction they wrap.
    while not isinstance(obj, JITFunction) and isinstance(obj, KernelInterface) \
            and hasattr(obj, "fn"):
        if isinstance(obj, Autotuner) and autotuner is None:
            autotuner = obj
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise LookupError(NOT_A_KERNEL, f"{module_name}.{qualname} is a "
                                        f"{type(obj).__name__}, not a @triton.jit kernel")
    return obj, autotuner


def _decode_constant(value: Any) -> Any:
    """A recorded constexpr value back to what the JIT passed (as JITFunction.preload does)."""
    import triton.language as tl
    from triton.runtime.jit import convert_to_tuple_if_list

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict):
        if "constexpr" in value:
            return tl.constexpr(convert_to_tuple_if_list(value["constexpr"]))
        if "jit_function" in value:
            module, _, qualname = str(value["jit_function"]).partition(":")
            fn, _ = _resolve_kernel(module, qualname)
            return fn
        if "repr" in value:
            raise ValueError(f"a constexpr recorded only as its repr {value['repr']!r}")
    return convert_to_tuple_if_list(value)


def _paths(entries: Any, field_name: str, decode: Callable[[Any], Any]) -> dict[tuple, Any]:
    out = {}
    for entry in entries or ():
        out[tuple(entry["path"])] = decode(entry[field_name])
    return out


def _options(record: dict) -> tuple[dict[str, Any], str | None]:
    """The recorded backend options as the JIT passed them, with extern libraries found
    here; (options, problem sentence or None)."""
    options = {k: tuple(v) if isinstance(v, list) else v
               for k, v in (record.get("options") or {}).items()}
    libs = options.get("extern_libs")
    if libs:
        kept = []
        for name, path in libs:
            if os.path.exists(path):
                kept.append((name, path))
            elif name != "libdevice":
                return options, (f"extern library {name} was {path} on the recording machine "
                                 "and is not there here")
            # libdevice: Triton's own copy here (the key hashes its content, not its path)
        options["extern_libs"] = tuple(kept) if kept else None
    return options, None


def _autotune_info(autotuner: Any, record: dict) -> dict[str, Any]:
    """How many configs the autotuner has and which one this record compiled."""
    constexprs = {c.get("name"): c.get("value") for c in record.get("constexprs") or ()
                  if isinstance(c, dict)}
    options = record.get("options") or {}
    keys: set[str] = set()
    match = None
    for index, config in enumerate(autotuner.configs):
        kwargs = dict(getattr(config, "kwargs", {}) or {})
        keys.update(kwargs)
        same = all(constexprs.get(k) == v for k, v in kwargs.items()) and all(
            getattr(config, attr, None) in (None, options.get(attr))
            for attr in ("num_warps", "num_stages", "num_ctas", "maxnreg"))
        if same and match is None:
            match = index
    rest = {k: v for k, v in constexprs.items() if k not in keys}
    group = json.dumps([record.get("signature"), record.get("attrs"), rest], sort_keys=True,
                       default=str)
    return {"configs": len(autotuner.configs), "match": match, "group": group}


# --------------------------------------------------------------------------------------------
# before the compiles: what every record of a run shares, done once in the replaying process
# --------------------------------------------------------------------------------------------

def prepare(records: Iterable[dict], toolchain: Toolchain) -> None:
    """Do in this process, once, what each compile would otherwise do in each worker: import
    Triton's compiler, hash Triton itself (``triton_key()``, about a second), read every ptxas
    version the records need (ours and Triton's own cache), and import every kernel module the
    records name.  Worker processes forked afterwards inherit all of it.  A module that does
    not import is left for its record to report; never raises for a record."""
    records = list(records)
    toolchain.read(records)
    try:
        import triton.compiler.code_generator  # noqa: F401  (imported by the first compile)
        from triton import knobs
        from triton.compiler import ASTSource  # noqa: F401
        from triton.runtime.cache import triton_key
    except Exception:  # no usable Triton: every record says so itself
        return
    triton_key()
    tool = getattr(knobs, "NvidiaTool", None)
    for path, version in toolchain.ptxas_versions.items():
        if version is not None and tool is not None:
            tool.from_path(path)  # Triton's own per-path cache of the same version
    for record in records:
        kernel = record["kernel"]
        with contextlib.suppress(LookupError):
            _resolve_kernel(kernel["module"], kernel["qualname"], kernel.get("source"))
        for constant in record.get("constexprs") or ():
            value = constant.get("value") if isinstance(constant, dict) else None
            if isinstance(value, dict) and isinstance(value.get("jit_function"), str):
                module, _, qualname = value["jit_function"].partition(":")
                with contextlib.suppress(LookupError):
                    _resolve_kernel(module, qualname)


# --------------------------------------------------------------------------------------------
# one record
# --------------------------------------------------------------------------------------------

def replay_record(record: dict, *, cache_dir: str, dry_run: bool = False,
                  toolchain: Toolchain | None = None) -> dict[str, Any]:
    """Rebuild one recorded entry into ``cache_dir``; never raises for a bad record.

    Returns ``{"status", "reason", "detail", "seconds", "autotune"}``.  The caller has run
    ``precheck``.  The cache-invalidating environment is made the recorded one for the
    compile, and ``TRITON_CACHE_DIR`` points at ``cache_dir``.  ``toolchain``: the run's
    toolchain facts (default: this interpreter's, read as needed).
    """
    start = time.perf_counter()

    def done(status: str, reason: str = "", detail: str = "", **extra: Any) -> dict[str, Any]:
        return {"status": status, "reason": reason, "detail": detail,
                "seconds": round(time.perf_counter() - start, 3), **extra}

    try:
        import triton
    except Exception as exc:
        return done(SKIPPED, TRITON_VERSION, f"Triton does not import here: {exc}")
    if triton.__version__ != record["triton_version"]:
        return done(SKIPPED, TRITON_VERSION,
                    f"recorded with Triton {record['triton_version']}, this interpreter has "
                    f"Triton {triton.__version__}: replay with an interpreter that has Triton "
                    f"{record['triton_version']} (--python)")
    if toolchain is None:
        toolchain = Toolchain.here()
    kernel = record["kernel"]
    try:
        fn, autotuner = _resolve_kernel(kernel["module"], kernel["qualname"],
                                        kernel.get("source"))
    except LookupError as exc:
        reason, detail = exc.args
        return done(SKIPPED, reason, detail)
    tuning = _autotune_info(autotuner, record) if autotuner is not None else None
    start = time.perf_counter()  # imports are not the kernel's time

    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager
    from triton.runtime.jit import convert_to_tuple_if_list

    recorded_env = {str(k): str(v) for k, v in (record.get("env") or {}).items()}
    env: dict[str, str | None] = {k: None for k in get_cache_invalidating_env_vars()}
    env.update(recorded_env)
    env.update(cache_environment(cache_dir))
    variable, ptxas, problem = toolchain.choose_ptxas(record)
    if problem:
        return done(SKIPPED, PTXAS_VERSION, problem, autotune=tuning)
    if ptxas:
        env[variable] = ptxas

    # scope(): a cache dir set in code (knobs.cache.dir = ...) would beat the variable.
    scope = knobs.cache.scope() if hasattr(knobs.cache, "scope") else contextlib.nullcontext()
    with locations.environment(env), scope, ptxas_version_scope(toolchain):
        knobs.cache.dir = cache_dir
        try:
            source_cls = ASTSource
            if getattr(fn, "is_gluon", lambda: False)():
                from triton.experimental.gluon._runtime import GluonASTSource as source_cls
            signature = {k: convert_to_tuple_if_list(v) for k, v in record["signature"].items()}
            try:
                constexprs = _paths(record["constexprs"], "value", _decode_constant)
                attrs = _paths(record["attrs"], "attrs", lambda v: v)
            except (ValueError, KeyError, TypeError) as exc:
                return done(SKIPPED, MISSING_FIELDS, f"a constexpr or attribute cannot be "
                            f"decoded: {type(exc).__name__}: {exc}", autotune=tuning)
            src = source_cls(fn, signature, constexprs, attrs)
            options, problem = _options(record)
            if problem:
                return done(SKIPPED, EXTERN_LIB, problem, autotune=tuning)
            t = record["target"]
            target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
            backend = make_backend(target)
            parsed = backend.parse_options(dict(options, **src.parse_options()))
            env_vars = get_cache_invalidating_env_vars()
            key = get_cache_key(src, backend, parsed, env_vars)
            inspect = getattr(knobs.runtime, "add_stages_inspection_hook", None)
            if inspect is not None:
                key += inspect()[0]
            computed = hashlib.sha256(key.encode("utf-8")).hexdigest()
        except LookupError as exc:  # a JITFunction constexpr that does not resolve
            reason, detail = exc.args
            return done(SKIPPED, reason, detail, autotune=tuning)
        except Exception as exc:
            return done(SKIPPED, KEY_MISMATCH,
                        f"the recorded specialization does not rebuild here: "
                        f"{type(exc).__name__}: {str(exc)[:300]}", autotune=tuning)
        recorded = record.get("hash")
        if recorded and computed != recorded:
            return done(SKIPPED, KEY_MISMATCH,
                        f"the cache key here is {computed[:12]}, recorded {recorded[:12]}: the "
                        "kernel source or what it calls, the Triton build (Python version), "
                        "ptxas or the cache-invalidating environment differ from the recording "
                        "machine", autotune=tuning)
        metadata_name = f"{src.name[:150]}.json"
        manager = get_cache_manager(computed)  # Triton's own lookup (creates the hash dir)
        group = manager.get_group(metadata_name) or {}
        if metadata_name in group:
            return done(PRESENT, autotune=tuning)
        if dry_run:
            remove_empty(getattr(manager, "cache_dir", None))
            return done(PLANNED, autotune=tuning)
        try:
            compiled = triton.compile(src, target=target, options=parsed.__dict__)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[-1][:300]
            return done(FAILED, COMPILE_ERROR, f"{type(exc).__name__}: {first}",
                        autotune=tuning)
    if compiled.hash != computed:  # would mean triton.compile keys differently than we do
        return done(FAILED, KEY_MISMATCH, f"compiled under key {compiled.hash[:12]}, expected "
                                          f"{computed[:12]}", autotune=tuning)
    detail = "" if recorded else "no key was recorded: written under the key computed here"
    return done(REBUILT, detail=detail, autotune=tuning)


def remove_empty(path: str | os.PathLike[str] | None) -> None:
    """A dry run leaves no trace: remove a directory Triton's lookup made, if it is empty."""
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass  # not empty, or not there: leave it
