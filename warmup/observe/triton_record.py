"""The compile-log line of a Triton compile: what a rebuild on a CPU machine needs, as JSON.

One listener call of Triton (joined with the ``jit_cache_hook`` record of the same compile,
when the compile came through ``@triton.jit``) becomes one record: the kernel's module and
qualified name and the sha256 of its source (``JITFunction.src``), the ``ASTSource`` it was
compiled from (signature, constexprs, attributes), every backend option, the target, the
cache-invalidating environment, the ptxas whose version the key hashed, and the cache key.  A
kernel defined in a module made at run time (Inductor's generated kernels) is marked
``generated``; its text is never copied into the log.  ``cache_tools.replay`` reads these records;
the field names are listed in :mod:`cache_tools.compile_log`.

Nothing here raises into the host for a value it does not know: unknown values are written as
``{"repr": ...}``.  Triton is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

from cache_tools import compile_log

# Fields of the jit_cache_hook's ``compile`` dict that describe the specialization.
_SPECIALIZATION_FIELDS = ("device", "num_warps", "num_ctas", "num_stages", "enable_fp_fusion",
                          "launch_cooperative_grid", "extern_libs", "is_warmup",
                          "specialization_data")


def build(record: dict, src: Any, metadata: dict, metadata_group: dict | None, times: Any,
          pending: dict | None, options_fields: Callable[[Any], frozenset[str]]) -> dict:
    """Fill the Triton fields of ``record`` (a new compile-log record of event ``miss`` or
    ``hit``) from one listener call and its jit_cache_hook record (``pending``, or None when
    ``triton.compile`` was called directly).  ``options_fields(target)`` names the backend's
    compile options.  Returns ``record``."""
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
    digest = source_sha256(fn)
    if digest is not None:
        kernel["source_sha256"] = digest
    if is_generated(inner):
        kernel["generated"] = True
    metadata = dict(metadata or {})
    target = metadata.get("target")
    options = {}
    if target is not None:
        try:
            fields = options_fields(target)
            options = {k: metadata[k] for k in sorted(fields) if k in metadata}
        except Exception:  # Triton's backend API varies by version: a record without options
            options = {}
    env = {}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        env = {k: metadata[k] for k in get_cache_invalidating_env_vars() if k in metadata}
    except Exception:  # Triton's private C API varies by version: a record without them
        env = {}
    record.update({
        "kernel": kernel,
        "key": None if pending is None else jsonable(pending.get("key")),
        "hash": metadata.get("hash"),
        "signature": {str(k): jsonable(v)
                      for k, v in (getattr(src, "signature", None) or {}).items()},
        "constexprs": encode_paths(getattr(src, "constants", None) or {}, fn, "value",
                                   encode_constant),
        "attrs": encode_paths(getattr(src, "attrs", None) or {}, fn, "attrs", jsonable),
        "options": jsonable(options),
        "env": jsonable(env),
        "target": target_json(target),
        "toolchain": toolchain(target),
        "triton_version": metadata.get("triton_version"),
        "duration_s": (times.total / 1e6) if times is not None else None,
        "stages": _stages(times),
        "cache_hit": record.get("event") == compile_log.HIT,
        # The files of the cache entry (names only) and the entry's directory name.
        "artifacts": sorted(str(k) for k in (metadata_group or {})),
        "cache_entry": _entry_dir(metadata_group),
        "specialization": None if pending is None else _specialization(pending, fn),
    })
    return record


def _specialization(pending: dict, fn: Any) -> dict:
    """The jit_cache_hook's view of the compile: launch options and Triton's own
    ``specialization_data`` (what ``JITFunction.preload`` takes)."""
    info = pending.get("compile") or {}
    specialization = {k: jsonable(info[k]) for k in _SPECIALIZATION_FIELDS if k in info}
    specialization["signature"] = {str(k): jsonable(v)
                                   for k, v in (info.get("signature") or {}).items()}
    specialization["constants"] = encode_paths(info.get("constants") or {}, fn, "value",
                                               encode_constant)
    specialization["configs"] = [encode_paths(c, fn, "attrs", jsonable)
                                 for c in (info.get("configs") or ())]
    specialization["repr"] = pending.get("repr")
    specialization["is_manual_warmup"] = pending.get("is_manual_warmup")
    return specialization


# --- the kernel's source --------------------------------------------------------------------

def source_sha256(fn: Any) -> str | None:
    """The sha256 of a JITFunction's source as Triton holds it (``fn.src``), which replay
    checks against the installed kernel before importing it; None when there is none."""
    src = getattr(fn, "src", None)
    try:
        return hashlib.sha256(src.encode("utf-8")).hexdigest() if isinstance(src, str) else None
    except UnicodeEncodeError:  # a lone surrogate in the source: no hash, so no replay
        return None


def is_generated(function: Any) -> bool:
    """Whether a kernel was defined in a module made at run time, which no other process can
    import by name: Inductor executes each generated kernel file as a module without an import
    spec (``torch._inductor.runtime.compile_tasks.<key>``).  Never raises."""
    namespace = getattr(function, "__globals__", None)
    return isinstance(namespace, dict) and namespace.get("__spec__", True) is None \
        and namespace.get("__name__") != "__main__"


# --- the toolchain the key hashed ------------------------------------------------------------

_toolchains: dict[tuple, dict | None] = {}


def toolchain(target: Any) -> dict | None:
    """The ptxas the cache key hashed (its path and ``--version`` output, as Triton's
    ``get_ptxas_version`` read it), for a CUDA target; None otherwise.

    The version is part of the key, and it differs between processes of one server: Inductor's
    compile workers point ``TRITON_PTXAS_PATH`` at the ptxas shipped in torch, the scheduler
    uses Triton's own.  Replay needs to know which.  Read once per (arch, variable value);
    never raises."""
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
    except Exception:  # Triton's NVIDIA backend API varies by version: no toolchain, a record
        return None


# --- JSON encoding -----------------------------------------------------------------------------

def _entry_dir(metadata_group: dict | None) -> str | None:
    for path in (metadata_group or {}).values():
        return Path(str(path)).parent.name
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
    except (AttributeError, TypeError, ValueError):  # a Triton whose stage times differ
        return None


def encode_paths(mapping: Any, fn: Any, field: str, encode: Callable[[Any], Any]) -> list[dict]:
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


def encode_constant(value: Any) -> Any:
    """A constexpr value the way Triton's ``serialize_specialization_data`` writes it."""
    cls = value.__class__.__name__
    if cls == "dtype":
        return str(value)
    if cls == "constexpr":
        return {"constexpr": jsonable(value.value)}
    if cls == "JITFunction":
        return {"jit_function": f"{value.module}:{value.fn.__qualname__}",
                "source_sha256": source_sha256(value)}
    return jsonable(value)


def jsonable(value: Any) -> Any:
    """``value`` as JSON types; what JSON cannot hold becomes ``{"repr": ...}``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(jsonable(v) for v in value)
    if value.__class__.__name__ == "GPUTarget":
        return target_json(value)
    if isinstance(value, Path):
        return str(value)
    return {"repr": repr(value)}


def target_json(target: Any) -> dict | None:
    """A ``GPUTarget`` (or its dict) as ``{"backend", "arch", "warp_size"}``."""
    if target is None:
        return None
    if isinstance(target, dict):
        return {k: target.get(k) for k in ("backend", "arch", "warp_size")}
    return {"backend": getattr(target, "backend", None), "arch": getattr(target, "arch", None),
            "warp_size": getattr(target, "warp_size", None)}
