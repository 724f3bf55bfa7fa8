"""The Triton worker of a replay: rebuild one recorded cache entry from the installed kernel,
and only under its own key.

For one compile-log record: *resolve* the kernel (checked on disk, then imported from the
installed packages: :mod:`cache_tools.replay.kernels`), *rebuild* the ``ASTSource``, options
and cache key the way ``triton.compile`` does, *compile* only when that key equals the recorded
one, and *check* that Triton wrote the entry under it.  Runs in the replaying process
(``--jobs 1``) or in a worker process; Triton and the kernels are imported here, lazily, so
the package stays standard-library-only at import.  A record's own text is data: nothing it
carries is executed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from cache_tools import locations
from cache_tools.replay import kernels
from cache_tools.replay.report import (COMPILE_ERROR, EXTERN_LIB, FAILED, KEY_MISMATCH,
                                       MISSING_FIELDS, NOT_A_KERNEL, PRESENT, PTXAS_VERSION,
                                       REBUILT, SKIPPED, TRITON_VERSION)
from cache_tools.replay.toolchain import Toolchain, ptxas_version_scope

# Cache-manager overrides that would send our writes somewhere other than the cache dir.
_MANAGER_VARS = ("TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND")


def cache_environment(cache_dir: str) -> dict[str, str | None]:
    """The variables that make Triton's file cache manager write into ``cache_dir``."""
    values: dict[str, str | None] = {v: None for v in _MANAGER_VARS}
    values[locations.kind("triton").variables[0]] = cache_dir
    return values


class _Stop(Exception):
    """Ends one record's replay with ``status``, ``reason`` and ``detail``."""

    def __init__(self, status: str, reason: str = "", detail: str = "") -> None:
        super().__init__(status, reason, detail)
        self.status, self.reason, self.detail = status, reason, detail


# --------------------------------------------------------------------------------------------
# resolve: the installed kernel
# --------------------------------------------------------------------------------------------

def resolve(module: Any, qualname: Any, source_sha256: Any) -> tuple[Any, Any]:
    """(the JITFunction, the Autotuner around it or None) of the installed kernel
    ``module:qualname`` whose source hashes to ``source_sha256``.  Raises
    :class:`~cache_tools.replay.kernels.Unresolved`."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction, KernelInterface

    installed = kernels.find(module, qualname, source_sha256)
    obj = kernels.load(installed)
    autotuner = None
    # Unwrap @triton.autotune / @triton.heuristics down to the JITFunction they wrap.
    while not isinstance(obj, JITFunction) and isinstance(obj, KernelInterface) \
            and hasattr(obj, "fn"):
        if isinstance(obj, Autotuner) and autotuner is None:
            autotuner = obj
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise kernels.Unresolved(NOT_A_KERNEL, f"{module}.{qualname} is a "
                                               f"{type(obj).__name__}, not a @triton.jit kernel")
    kernels.check_loaded(installed, obj.src)
    return obj, autotuner


def _record_kernel(record: dict[str, Any]) -> tuple[Any, Any]:
    kernel = record["kernel"]
    try:
        return resolve(kernel["module"], kernel["qualname"], kernel.get("source_sha256"))
    except kernels.Unresolved as exc:
        raise _Stop(SKIPPED, exc.reason, exc.detail) from None


def jit_function_constants(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The constexpr values of ``record`` that name another kernel (``{"jit_function": ...}``)."""
    for constant in record.get("constexprs") or ():
        value = constant.get("value") if isinstance(constant, dict) else None
        if isinstance(value, dict) and isinstance(value.get("jit_function"), str):
            yield value


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
            fn, _ = resolve(module, qualname, value.get("source_sha256"))
            return fn
        if "repr" in value:
            raise ValueError(f"a constexpr recorded only as its repr {value['repr']!r}")
    return convert_to_tuple_if_list(value)


def _autotune_info(autotuner: Any, record: dict[str, Any]) -> dict[str, Any]:
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
# rebuild: the ASTSource, the options and the key
# --------------------------------------------------------------------------------------------

@dataclass
class _Rebuilt:
    """What ``triton.compile`` needs for one record, and the key it will write under."""

    src: Any
    target: Any
    options: dict[str, Any]
    key: str


def _paths(entries: Any, field_name: str, decode: Callable[[Any], Any]
           ) -> dict[tuple[int, ...], Any]:
    return {tuple(entry["path"]): decode(entry[field_name]) for entry in entries or ()}


def _options(record: dict[str, Any]) -> dict[str, Any]:
    """The recorded backend options as the JIT passed them, with extern libraries found
    here; raises _Stop when a library other than libdevice is missing."""
    options = {k: tuple(v) if isinstance(v, list) else v
               for k, v in (record.get("options") or {}).items()}
    libs = options.get("extern_libs")
    if libs:
        kept = []
        for name, path in libs:
            if os.path.exists(path):
                kept.append((name, path))
            elif name != "libdevice":
                raise _Stop(SKIPPED, EXTERN_LIB, f"extern library {name} was {path} on the "
                                                 "recording machine and is not there here")
            # libdevice: Triton's own copy here (the key hashes its content, not its path)
        options["extern_libs"] = tuple(kept) if kept else None
    return options


def _source(fn: Any, record: dict[str, Any]) -> Any:
    from triton.compiler import ASTSource
    from triton.runtime.jit import convert_to_tuple_if_list

    source_cls = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource
        source_cls = GluonASTSource
    signature = {k: convert_to_tuple_if_list(v) for k, v in record["signature"].items()}
    try:
        constexprs = _paths(record["constexprs"], "value", _decode_constant)
        attrs = _paths(record["attrs"], "attrs", lambda v: v)
    except (ValueError, KeyError, TypeError) as exc:
        raise _Stop(SKIPPED, MISSING_FIELDS, f"a constexpr or attribute cannot be decoded: "
                                             f"{type(exc).__name__}: {exc}") from None
    except kernels.Unresolved as exc:  # a JITFunction constexpr that does not resolve
        raise _Stop(SKIPPED, exc.reason, exc.detail) from None
    return source_cls(fn, signature, constexprs, attrs)


def rebuild(fn: Any, record: dict[str, Any]) -> _Rebuilt:
    """The ASTSource, target, parsed options and cache key of ``record``, computed the way
    ``triton.compile`` computes them (under the compile environment)."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key

    try:
        src = _source(fn, record)
        options = _options(record)
        t = record["target"]
        target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
        backend = make_backend(target)
        parsed = backend.parse_options(dict(options, **src.parse_options()))
        key = get_cache_key(src, backend, parsed, get_cache_invalidating_env_vars())
        inspect_stages = getattr(knobs.runtime, "add_stages_inspection_hook", None)
        if inspect_stages is not None:
            key += inspect_stages()[0]
    except _Stop:
        raise
    except Exception as exc:  # Triton refuses a record's specialization its own way: skipped
        raise _Stop(SKIPPED, KEY_MISMATCH, f"the recorded specialization does not rebuild "
                                           f"here: {type(exc).__name__}: {str(exc)[:300]}") from None
    return _Rebuilt(src, target, parsed.__dict__,
                    hashlib.sha256(key.encode("utf-8")).hexdigest())


def _check_key(record: dict[str, Any], computed: str) -> None:
    recorded = record.get("hash")
    if recorded and computed != recorded:
        raise _Stop(SKIPPED, KEY_MISMATCH,
                    f"the cache key here is {computed[:12]}, recorded {recorded[:12]}: the kernel "
                    "source or what it calls, the Triton build (Python version), ptxas or the "
                    "cache-invalidating environment differ from the recording machine")


# --------------------------------------------------------------------------------------------
# compile and check
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _compile_environment(record: dict[str, Any], cache_dir: str, toolchain: Toolchain) -> Iterator[None]:
    """The recorded cache-invalidating environment, the recorded ptxas, and Triton's cache
    pointed at ``cache_dir`` (also where code set ``knobs.cache.dir``)."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars

    env: dict[str, str | None] = {k: None for k in get_cache_invalidating_env_vars()}
    env.update({str(k): str(v) for k, v in (record.get("env") or {}).items()})
    env.update(cache_environment(cache_dir))
    variable, ptxas, problem = toolchain.choose_ptxas(record)
    if problem:
        raise _Stop(SKIPPED, PTXAS_VERSION, problem)
    if ptxas:
        env[str(variable)] = ptxas
    scope = knobs.cache.scope() if hasattr(knobs.cache, "scope") else contextlib.nullcontext()
    with locations.environment(env), scope, ptxas_version_scope(toolchain):
        knobs.cache.dir = cache_dir
        yield


def _present(rebuilt: _Rebuilt) -> bool:
    """Whether the cache already holds the entry (Triton's own lookup)."""
    from triton.runtime.cache import get_cache_manager

    name = f"{rebuilt.src.name[:150]}.json"
    return name in (get_cache_manager(rebuilt.key).get_group(name) or {})


def _compile(rebuilt: _Rebuilt) -> Any:
    import triton

    try:
        return triton.compile(rebuilt.src, target=rebuilt.target, options=rebuilt.options)
    except Exception as exc:  # a compile that fails (any kind) is the record's reported result
        first = (str(exc).strip().splitlines() or [""])[-1][:300]
        raise _Stop(FAILED, COMPILE_ERROR, f"{type(exc).__name__}: {first}") from None


def _check_compiled(compiled: Any, computed: str) -> None:
    if compiled.hash != computed:  # would mean triton.compile keys differently than we do
        raise _Stop(FAILED, KEY_MISMATCH, f"compiled under key {compiled.hash[:12]}, expected "
                                          f"{computed[:12]}")


def _check_triton(record: dict[str, Any]) -> None:
    try:
        import triton
    except Exception as exc:  # an installed Triton may raise anything on import: skipped
        raise _Stop(SKIPPED, TRITON_VERSION, f"Triton does not import here: {exc}") from None
    if triton.__version__ != record["triton_version"]:
        raise _Stop(SKIPPED, TRITON_VERSION,
                    f"recorded with Triton {record['triton_version']}, this interpreter has "
                    f"Triton {triton.__version__}: replay with an interpreter that has Triton "
                    f"{record['triton_version']} (--python)")


def replay_record(record: dict[str, Any], *, cache_dir: str,
                  toolchain: Toolchain | None = None) -> dict[str, Any]:
    """Rebuild one recorded entry into ``cache_dir``: resolve, rebuild, compile, check.
    Never raises for a bad record.

    Returns ``{"status", "reason", "detail", "seconds", "autotune"}``.  The caller has run
    ``precheck``.  ``toolchain``: the run's toolchain facts (default: this interpreter's).
    """
    start = time.perf_counter()
    tuning = None
    try:
        _check_triton(record)
        fn, autotuner = _record_kernel(record)
        tuning = _autotune_info(autotuner, record) if autotuner is not None else None
        start = time.perf_counter()  # imports are not the kernel's time
        with _compile_environment(record, cache_dir, toolchain or Toolchain.here()):
            rebuilt = rebuild(fn, record)
            _check_key(record, rebuilt.key)
            if _present(rebuilt):
                raise _Stop(PRESENT)
            compiled = _compile(rebuilt)
        _check_compiled(compiled, rebuilt.key)
        detail = "" if record.get("hash") else \
            "no key was recorded: written under the key computed here"
        outcome = _Stop(REBUILT, "", detail)
    except _Stop as stop:
        outcome = stop
    return {"status": outcome.status, "reason": outcome.reason, "detail": outcome.detail,
            "seconds": round(time.perf_counter() - start, 3), "autotune": tuning}


# --------------------------------------------------------------------------------------------
# before the compiles: what every record of a run shares, done once in the replaying process
# --------------------------------------------------------------------------------------------

def prepare(records: Iterable[dict[str, Any]], toolchain: Toolchain) -> None:
    """Do in this process, once, what each compile would otherwise do in each worker: import
    Triton's compiler, hash Triton itself (``triton_key()``, about a second), read every ptxas
    version the records need (ours and Triton's own cache), and import every installed kernel
    module the records name that passes the checks.  Worker processes forked afterwards
    inherit all of it.  Never raises for a record."""
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
        with contextlib.suppress(kernels.Unresolved):
            resolve(kernel["module"], kernel["qualname"], kernel.get("source_sha256"))
        for value in jit_function_constants(record):
            module, _, qualname = value["jit_function"].partition(":")
            with contextlib.suppress(kernels.Unresolved):
                resolve(module, qualname, value.get("source_sha256"))

