"""Rebuild Triton cache entries on a machine without a GPU from a recorded compile manifest.

A serving process with sglang-warmup's events installed writes one JSON line per Triton
compile (``<state_dir>/manifest/compiles-<pid>.jsonl``, see ``warmup/events.py``): the kernel's
module and qualified name, the ``ASTSource`` it was compiled from (signature, constexprs,
attributes), every backend option, the target, the cache-invalidating environment and the
cache key (``hash``) the JIT looked up.  ``replay()`` re-imports each kernel, rebuilds the same
``ASTSource``, recomputes the cache key exactly as ``triton.compile`` does and compiles only
when that key equals the recorded one, so every entry it writes is one a serving process will
look up.  Anything that cannot give the recorded key is skipped with its reason: a nested
function, a module that does not import, a different Triton (the key hashes Triton's own
files, ``libtriton`` included), different kernel source (another SGLang release), options or
``ptxas``.

Compiles run in worker processes (``jobs``), or in this process for ``jobs=1``; Triton is
imported lazily there, so this module stays standard-library-only at import.  A manifest
recorded under another Triton is replayed with an interpreter that has that Triton
(``python=``): the replay then runs as ``PYTHON -m cache_tools.replay ... --json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from cache_tools import compile_log, locations
from cache_tools.errors import CacheError


# Statuses of one kernel specialization.
REBUILT = "rebuilt"      # compiled into the cache dir; its key equals the recorded one
PRESENT = "present"      # the cache dir already holds the entry
PLANNED = "planned"      # --dry-run: would be rebuilt
SKIPPED = "skipped"      # cannot give the recorded key; see reason
FAILED = "failed"        # the compile itself raised
STATUSES = (REBUILT, PRESENT, PLANNED, SKIPPED, FAILED)

# Reasons for SKIPPED (and FAILED), one word each; the detail sentence says the rest.
MISSING_FIELDS = "missing-fields"
IR_SOURCE = "ir-source"
NESTED = "nested-function"
NOT_IMPORTABLE = "not-importable"
NOT_A_KERNEL = "not-a-kernel"
TRITON_VERSION = "triton-version"
OTHER_TARGET = "other-target"
EXTERN_LIB = "extern-lib"
KEY_MISMATCH = "key-mismatch"
PTXAS_VERSION = "ptxas-version"
COMPILE_ERROR = "compile-error"

# Cache-manager overrides that would send our writes somewhere other than the cache dir.
_MANAGER_VARS = ("TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND")
_REQUIRED = ("signature", "constexprs", "attrs", "options", "target", "triton_version")


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelResult:
    """What happened to one recorded specialization (one cache entry).

    ``kernel``: ``module:qualname``; ``name``: the kernel's function name; ``specialization``:
    a short human summary (constexprs, warps, stages); ``hash``: the recorded cache key (the
    entry's directory name); ``status``: one of STATUSES; ``reason``: for skipped/failed, one
    word (MISSING_FIELDS, NESTED, ...); ``detail``: one sentence; ``seconds``: time spent on
    it (import excluded); ``records``: how many manifest lines named this entry (ranks,
    repeated misses, disk hits); ``phases``: the phases those lines were recorded in.
    """

    kernel: str
    name: str
    specialization: str
    hash: str | None
    target: str
    status: str
    reason: str = ""
    detail: str = ""
    seconds: float = 0.0
    records: int = 1
    phases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["phases"] = list(self.phases)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "KernelResult":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["phases"] = tuple(values.get("phases") or ())
        return cls(**values)


@dataclass(frozen=True)
class ReplayReport:
    """The outcome of one replay.

    ``manifests``: the files read; ``cache_dir``: where entries were written; ``target``: the
    ``--target`` filter (None: every recorded target); ``python`` / ``triton_version``: the
    interpreter that compiled and its Triton; ``results``: one per distinct recorded cache
    entry, in manifest order; ``ignored``: manifest lines that are not Triton compiles (device
    loads, nvcc builds); ``warnings``: unreadable lines, incomplete autotuning records.
    """

    manifests: tuple[str, ...]
    cache_dir: str
    target: str | None
    python: str
    triton_version: str | None
    dry_run: bool
    jobs: int
    results: tuple[KernelResult, ...]
    ignored: int = 0
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def counts(self) -> dict[str, int]:
        return {s: self.count(s) for s in STATUSES}

    @property
    def skip_reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            if r.status in (SKIPPED, FAILED):
                out[r.reason] = out.get(r.reason, 0) + 1
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "manifests": list(self.manifests), "cache_dir": self.cache_dir,
            "target": self.target, "python": self.python,
            "triton_version": self.triton_version, "dry_run": self.dry_run, "jobs": self.jobs,
            "counts": self.counts, "skip_reasons": self.skip_reasons,
            "ignored": self.ignored, "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
            "results": [r.to_json() for r in self.results],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ReplayReport":
        return cls(
            manifests=tuple(data["manifests"]), cache_dir=data["cache_dir"],
            target=data.get("target"), python=data["python"],
            triton_version=data.get("triton_version"), dry_run=bool(data["dry_run"]),
            jobs=int(data["jobs"]),
            results=tuple(KernelResult.from_json(r) for r in data["results"]),
            ignored=int(data.get("ignored", 0)), warnings=tuple(data.get("warnings") or ()),
            seconds=float(data.get("seconds", 0.0)))


# --------------------------------------------------------------------------------------------
# reading the manifest
# --------------------------------------------------------------------------------------------

def log_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The compile-log files named by ``paths``: a ``compiles-<pid>.jsonl`` file, a directory
    holding such files, or a state directory above its ``compile_log/``."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CacheError(f"{path}: no such file or directory",
                             hint="pass a compiles-<pid>.jsonl file, the compile_log/ directory "
                                  "or the WARMUP_STATE_DIR above it")
        found = compile_log.find(path)
        if not found:
            raise CacheError(f"{path}: no {compile_log.GLOB} files here or in "
                             f"{compile_log.directory(path)}",
                             hint="record one with WARMUP_ENABLE=1 and WARMUP_STATE_DIR set on "
                                  "the serving machine")
        out.extend(found)
    return out


def read_records(files: Sequence[Path]) -> tuple[list[dict], list[str]]:
    """Every record of ``files`` (in file, then line order) and a warning per line skipped
    (the torn last line of a killed process)."""
    warnings: list[str] = []
    try:
        records = compile_log.read(files, warnings=warnings, by_time=False)
    except OSError as exc:
        raise CacheError(f"{exc.filename}: cannot read: {exc.strerror or exc}",
                         hint="check the path and its permissions") from None
    return records, warnings


def is_triton_compile(record: dict) -> bool:
    """A Triton compile line (a miss, or a disk hit that names the same kind of entry)."""
    return record.get("compiler") == "triton" and record.get("event") in ("miss", "hit")


def parse_target(text: str) -> tuple[str, int | str, int | None]:
    """``cuda:90`` / ``cuda:90:32`` / ``hip:gfx942:64`` -> (backend, arch, warp_size or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise CacheError(f"--target {text!r}: expected BACKEND:ARCH[:WARP_SIZE]",
                         hint="for example --target cuda:90 (H100/H200) or cuda:100 (B200)")
    arch: int | str = int(parts[1]) if parts[1].isdigit() else parts[1]
    warp: int | None = None
    if len(parts) == 3:
        if not parts[2].isdigit():
            raise CacheError(f"--target {text!r}: warp size {parts[2]!r} is not a number",
                             hint="for example --target cuda:90:32")
        warp = int(parts[2])
    return parts[0], arch, warp


def target_str(target: Any) -> str:
    if not isinstance(target, dict):
        return "?"
    text = f"{target.get('backend')}:{target.get('arch')}"
    return text


def _kernel_label(record: dict) -> str:
    kernel = record.get("kernel") or {}
    module = kernel.get("module") or "?"
    qualname = kernel.get("qualname") or kernel.get("name") or "?"
    return f"{module}:{qualname}"


def _summary(record: dict) -> str:
    """``BLOCK=128, EVEN=True; w4 s3`` for a table cell."""
    parts = []
    for c in record.get("constexprs") or ():
        if not isinstance(c, dict):
            continue
        label = c.get("name") or ".".join(str(p) for p in c.get("path") or ())
        value = c.get("value")
        if isinstance(value, dict) and "constexpr" in value:
            value = value["constexpr"]
        text = json.dumps(value) if not isinstance(value, str) else value
        parts.append(f"{label}={text if len(text) <= 24 else text[:21] + '...'}")
    options = record.get("options") or {}
    tail = f"w{options.get('num_warps', '?')} s{options.get('num_stages', '?')}"
    return (", ".join(parts) + "; " if parts else "") + tail


def _dedup_key(record: dict) -> str:
    if record.get("hash"):
        return str(record["hash"])
    blob = json.dumps([_kernel_label(record)] + [record.get(k) for k in _REQUIRED],
                      sort_keys=True, default=str)
    return "unhashed:" + hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class _Item:
    """One distinct recorded cache entry and the manifest lines that named it."""

    record: dict = field(compare=False)
    records: int
    phases: tuple[str, ...]


def distinct_entries(records: Iterable[dict]) -> list[_Item]:
    """Triton compile lines grouped by recorded cache key, first occurrence first."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        if is_triton_compile(record):
            groups.setdefault(_dedup_key(record), []).append(record)
    items = []
    for lines in groups.values():
        # Prefer a miss: it carries the jit_cache_hook data too.
        best = next((r for r in lines if r.get("event") == "miss"), lines[0])
        phases = tuple(sorted({str(r.get("phase")) for r in lines if r.get("phase")}))
        items.append(_Item(best, len(lines), phases))
    return items


# --------------------------------------------------------------------------------------------
# checks that need no Triton
# --------------------------------------------------------------------------------------------

def precheck(record: dict, *, target: tuple[str, int | str, int | None] | None,
             triton_version: str | None) -> tuple[str, str] | None:
    """(reason, detail) when ``record`` cannot be replayed here, found without importing
    Triton or the kernel; None when it is worth a try."""
    kernel = record.get("kernel") if isinstance(record.get("kernel"), dict) else {}
    if kernel.get("path") and not kernel.get("module"):
        return IR_SOURCE, (f"compiled from the IR file {kernel['path']}, not from a Python "
                           "kernel: nothing to re-import")
    missing = [k for k in ("module", "qualname") if not kernel.get(k)]
    missing = [f"kernel.{k}" for k in missing]
    missing += [k for k in _REQUIRED if record.get(k) in (None, "", {})
                and not (k in ("constexprs", "attrs") and record.get(k) == [])]
    t = record.get("target")
    if isinstance(t, dict) and not all(t.get(k) is not None for k in ("backend", "arch",
                                                                     "warp_size")):
        missing.append("target.backend/arch/warp_size")
    if missing:
        return MISSING_FIELDS, f"the record lacks {', '.join(missing)}"
    module, qualname = kernel["module"], kernel["qualname"]
    if "<locals>" in qualname.split("."):
        return NESTED, (f"{qualname} is defined inside a function (a closure or nested "
                        "kernel): it cannot be imported by name")
    if module == "__main__":
        return NOT_IMPORTABLE, (f"{qualname} was defined in a script run as __main__: move "
                                "it into an importable module")
    if target is not None:
        backend, arch, warp = target
        rec = record["target"]
        if rec.get("backend") != backend or str(rec.get("arch")) != str(arch) or (
                warp is not None and rec.get("warp_size") != warp):
            wanted = f"{backend}:{arch}" + (f":{warp}" if warp is not None else "")
            return OTHER_TARGET, f"recorded for {target_str(rec)}, replaying {wanted} only"
    if triton_version is not None and record["triton_version"] != triton_version:
        return TRITON_VERSION, (f"recorded with Triton {record['triton_version']}, this "
                                f"interpreter has Triton {triton_version}: the cache key "
                                "hashes Triton itself; replay with an interpreter that has "
                                f"Triton {record['triton_version']} (--python)")
    return None


def _installed_triton() -> str | None:
    """The version of the Triton this interpreter would import, without importing it."""
    from importlib import metadata

    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------
# the worker side (imports Triton and the kernels)
# --------------------------------------------------------------------------------------------

def _cache_environment(cache_dir: str) -> dict[str, str | None]:
    """The variables that make Triton's file cache manager write into ``cache_dir``."""
    values: dict[str, str | None] = {v: None for v in _MANAGER_VARS}
    values[locations.kind("triton").variables[0]] = cache_dir
    return values


_source_dir: Path | None = None


def _recorded_source_dir() -> Path:
    """A private directory of this process for recorded kernel modules (removed at exit)."""
    global _source_dir
    if _source_dir is None:
        import atexit
        import shutil

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
    """Execute a kernel module from the text its manifest line carries (a module that was
    made at run time, such as Inductor's generated kernels), as Inductor itself loads it:
    a module of the recorded name with ``__file__`` set, registered in ``sys.modules``."""
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        return loaded
    text = source.get("text")
    if not isinstance(text, str):
        raise LookupError(NOT_IMPORTABLE, f"{module_name} was made at run time and its "
                                          "manifest line carries no source text")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != source.get("sha256"):
        raise LookupError(NOT_IMPORTABLE, f"the source recorded for {module_name} does not "
                                          "match its sha256: the manifest line is damaged")
    name = str(source.get("file") or "")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py", name):
        name = f"{digest[:32]}.py"
    path = _recorded_source_dir() / digest[:16] / name
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


_ptxas_versions: dict[str, str | None] = {}


def _ptxas_version(path: str) -> str | None:
    """``ptxas --version`` as Triton's ``get_ptxas_version`` reads it (stdout, decoded)."""
    if path not in _ptxas_versions:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, timeout=60,
                                 check=True).stdout.decode("utf-8")
        except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
            out = None
        _ptxas_versions[path] = out
    return _ptxas_versions[path]


def _ptxas_release(version: str | None) -> str:
    match = re.search(r"release (\d+\.\d+), (V[\d.]+)", version or "")
    return f"CUDA {match.group(1)} ({match.group(2)})" if match else "an unknown version"


@contextlib.contextmanager
def _ptxas_version_scope() -> Iterator[None]:
    """Triton caches the ptxas version per architecture, not per ptxas: records compiled with
    different ptxas binaries (``TRITON_PTXAS_PATH`` set per record) must each read their own,
    and the process must not keep the last record's afterwards."""

    def forget() -> None:
        try:
            from triton.backends.nvidia import compiler as nvidia

            nvidia.get_ptxas_version.cache_clear()
        except (ImportError, AttributeError):
            pass

    forget()
    try:
        yield
    finally:
        forget()


def choose_ptxas(record: dict, triton_dir: str) -> tuple[str | None, str | None, str | None]:
    """(variable, path, problem): the ptxas whose ``--version`` equals the recorded one.

    The recording process may have used another ptxas than Triton's own (Inductor's compile
    workers use the one shipped in torch); the cache key hashes its version.  Tried in
    order: the variable already set here, the recorded path, the recorded path's part below
    ``site-packages/`` under this interpreter's site-packages, Triton's bundled ptxas.
    (None, None, None) when the record names no ptxas (older manifests, other backends)."""
    toolchain = record.get("toolchain") if isinstance(record.get("toolchain"), dict) else {}
    wanted, recorded = toolchain.get("ptxas_version"), toolchain.get("ptxas")
    target = record.get("target") or {}
    if not isinstance(wanted, str) or not wanted or target.get("backend") != "cuda":
        return None, None, None
    try:
        blackwell = int(target.get("arch")) >= 100
    except (TypeError, ValueError):
        blackwell = False
    variable = "TRITON_PTXAS_BLACKWELL_PATH" if blackwell else "TRITON_PTXAS_PATH"
    binary = "ptxas-blackwell" if blackwell else "ptxas"
    candidates = [os.environ.get(variable)]
    if isinstance(recorded, str):
        candidates.append(recorded)
        if "/site-packages/" in recorded:
            import site

            below = recorded.split("/site-packages/", 1)[1]
            roots = list(getattr(site, "getsitepackages", lambda: [])())
            roots += [p for p in sys.path if p.endswith("site-packages")]
            candidates += [os.path.join(root, below) for root in roots]
    candidates.append(os.path.join(triton_dir, "backends", "nvidia", "bin", binary))
    tried = []
    for path in dict.fromkeys(c for c in candidates if c):
        if not os.path.isfile(path):
            continue
        tried.append(path)
        if _ptxas_version(path) == wanted:
            return variable, path, None
    here = ", ".join(f"{p} ({_ptxas_release(_ptxas_version(p))})" for p in tried) or "none"
    return variable, None, (f"recorded with the ptxas at {recorded} ({_ptxas_release(wanted)}); "
                            f"none here reports that version (tried: {here}): set {variable} "
                            "to a ptxas of that release")


def replay_record(record: dict, *, cache_dir: str, dry_run: bool = False) -> dict[str, Any]:
    """Rebuild one recorded entry into ``cache_dir``; never raises for a bad record.

    Returns ``{"status", "reason", "detail", "seconds", "autotune"}``.  The caller has run
    ``precheck``.  The cache-invalidating environment is made the recorded one for the
    compile, and ``TRITON_CACHE_DIR`` points at ``cache_dir``.
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
    kernel = record["kernel"]
    try:
        fn, autotuner = _resolve_kernel(kernel["module"], kernel["qualname"],
                                        kernel.get("source"))
    except LookupError as exc:
        reason, detail = exc.args
        return done(SKIPPED, reason, detail)
    tuning = _autotune_info(autotuner, record) if autotuner is not None else None
    start = time.perf_counter()  # imports are not the kernel's time

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager
    from triton.runtime.jit import convert_to_tuple_if_list

    recorded_env = {str(k): str(v) for k, v in (record.get("env") or {}).items()}
    env: dict[str, str | None] = {k: None for k in get_cache_invalidating_env_vars()}
    env.update(recorded_env)
    env.update(_cache_environment(cache_dir))
    variable, ptxas, problem = choose_ptxas(record, os.path.dirname(triton.__file__))
    if problem:
        return done(SKIPPED, PTXAS_VERSION, problem, autotune=tuning)
    if ptxas:
        env[variable] = ptxas
    from triton import knobs

    # scope(): a cache dir set in code (knobs.cache.dir = ...) would beat the variable.
    scope = knobs.cache.scope() if hasattr(knobs.cache, "scope") else contextlib.nullcontext()
    with locations.environment(env), scope, _ptxas_version_scope():
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
            _remove_empty(getattr(manager, "cache_dir", None))
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


def _remove_empty(path: str | os.PathLike[str] | None) -> None:
    """A dry run leaves no trace: remove a directory Triton's lookup made, if it is empty."""
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass  # not empty, or not there: leave it


def _worker_init(cache_dir: str) -> None:
    """Spawned workers: the cache directory for their whole life."""
    for key, value in _cache_environment(cache_dir).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _worker(record: dict, cache_dir: str, dry_run: bool) -> dict[str, Any]:
    try:
        return replay_record(record, cache_dir=cache_dir, dry_run=dry_run)
    except Exception as exc:  # a bug of ours must not lose the other results
        return {"status": FAILED, "reason": COMPILE_ERROR,
                "detail": f"replay error: {type(exc).__name__}: {exc}", "seconds": 0.0}


# --------------------------------------------------------------------------------------------
# the replay
# --------------------------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """Where a serving process on this machine would look for Triton entries."""
    (location,) = locations.resolve([locations.kind("triton")])
    if location.path is None:
        raise CacheError("no Triton cache directory is configured here",
                         hint="pass --cache-dir DIR")
    return location.path


def replay(manifests: Sequence[str | os.PathLike[str]], *,
           cache_dir: str | os.PathLike[str] | None = None, target: str | None = None,
           jobs: int | None = None, dry_run: bool = False,
           python: str | os.PathLike[str] | None = None,
           on_result: Callable[[KernelResult, int, int], None] | None = None) -> ReplayReport:
    """Rebuild every Triton entry recorded in ``manifests`` into ``cache_dir``.

    ``target``: only records for this target (``cuda:90``); ``jobs``: worker processes (1:
    this process; default: one per CPU); ``dry_run``: resolve and check every record, compile
    nothing; ``python``: run the whole replay in that interpreter instead (one with the
    Triton the manifest was recorded with); ``on_result(result, done, total)``: called as
    each entry finishes (progress).
    """
    started = time.perf_counter()
    if jobs is not None and jobs < 1:
        raise CacheError(f"--jobs {jobs}: expected 1 or more",
                         hint="--jobs 1 compiles in this process; more use worker processes")
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wanted = parse_target(target) if target else None
    files = log_files(manifests)
    if python is not None:
        return _replay_elsewhere(Path(python), files, cache_dir=directory, target=target,
                                 jobs=jobs, dry_run=dry_run)
    records, warnings = read_records(files)
    items = distinct_entries(records)
    ignored = sum(1 for r in records if not is_triton_compile(r))
    version = _installed_triton()
    root_existed = directory.exists()
    if not dry_run:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"{directory}: cannot create the cache directory: "
                             f"{exc.strerror or exc}", hint="pass a writable --cache-dir") from None
    directory = directory.resolve() if directory.exists() else directory.absolute()
    workers = jobs if jobs is not None else max(1, os.cpu_count() or 1)

    results: list[KernelResult | None] = [None] * len(items)
    todo: list[int] = []
    total = len(items)
    finished = 0

    def base(item: _Item, **values: Any) -> KernelResult:
        rec = item.record
        return KernelResult(kernel=_kernel_label(rec),
                            name=str((rec.get("kernel") or {}).get("name") or "?"),
                            specialization=_summary(rec), hash=rec.get("hash"),
                            target=target_str(rec.get("target")), records=item.records,
                            phases=item.phases, **values)

    def finish(index: int, result: KernelResult) -> None:
        nonlocal finished
        results[index] = result
        finished += 1
        if on_result is not None:
            on_result(result, finished, total)

    for index, item in enumerate(items):
        problem = precheck(item.record, target=wanted, triton_version=version)
        if problem is not None:
            finish(index, base(item, status=SKIPPED, reason=problem[0], detail=problem[1]))
        else:
            todo.append(index)

    tuning: dict[int, dict] = {}

    def collect(index: int, outcome: dict[str, Any]) -> None:
        if outcome.get("autotune"):
            tuning[index] = outcome["autotune"]
        finish(index, base(items[index], status=outcome["status"],
                           reason=outcome.get("reason", ""), detail=outcome.get("detail", ""),
                           seconds=float(outcome.get("seconds", 0.0))))

    if todo and workers == 1:
        with locations.environment(_cache_environment(str(directory))):
            for index in todo:
                collect(index, _worker(items[index].record, str(directory), dry_run))
    elif todo:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=context,
                                 initializer=_worker_init,
                                 initargs=(str(directory),)) as pool:
            futures = {pool.submit(_worker, items[i].record, str(directory), dry_run): i
                       for i in todo}
            for future in as_completed(futures):
                index = futures[future]
                try:
                    outcome = future.result()
                except Exception as exc:  # a worker died (killed, out of memory)
                    outcome = {"status": FAILED, "reason": COMPILE_ERROR,
                               "detail": f"worker process failed: {type(exc).__name__}: {exc}"}
                collect(index, outcome)

    if dry_run and not root_existed:
        _remove_empty(directory)
    warnings.extend(_autotune_warnings(items, tuning))
    done_results = [r for r in results if r is not None]
    mismatched = sum(1 for r in done_results if r.reason == KEY_MISMATCH)
    if mismatched > 1 and not any(r.status in (REBUILT, PRESENT, PLANNED)
                                  for r in done_results):
        warnings.append(f"all {mismatched} recomputed cache keys differ from the recorded ones: "
                        "the toolchain differs from the recording machine's (the Triton wheel "
                        "or Python version, ptxas, the cache-invalidating environment), not "
                        "single kernels")
    return ReplayReport(
        manifests=tuple(str(f) for f in files), cache_dir=str(directory),
        target=target, python=sys.executable, triton_version=version, dry_run=dry_run,
        jobs=workers, results=tuple(done_results), ignored=ignored,
        warnings=tuple(warnings), seconds=time.perf_counter() - started)


def _autotune_warnings(items: Sequence[_Item], tuning: dict[int, dict]) -> list[str]:
    """One warning per autotuned specialization whose manifest lacks some of its configs:
    a cold serving process benchmarks every config, and the unrecorded ones compile there."""
    groups: dict[tuple[str, str], tuple[int, set[int]]] = {}
    for index, info in tuning.items():
        label = _kernel_label(items[index].record)
        configs, seen = groups.get((label, info["group"]), (info["configs"], set()))
        if info.get("match") is not None:
            seen.add(int(info["match"]))
        groups[(label, info["group"])] = (configs, seen)
    out = []
    for (label, _group), (configs, seen) in groups.items():
        if len(seen) < configs:
            out.append(f"{label}: autotuned, {len(seen)} of its {configs} configs recorded for "
                       "one specialization; a cold serving process that benchmarks the others "
                       "compiles them (fewer if the autotuner prunes its configs)")
    return out


def _replay_elsewhere(python: Path, files: Sequence[Path], *, cache_dir: Path,
                      target: str | None, jobs: int | None, dry_run: bool) -> ReplayReport:
    """Run the replay as ``PYTHON -m cache_tools.replay ... --json`` and read its report."""
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise CacheError(f"--python {python}: not an executable file",
                         hint="pass the interpreter of an environment with the recorded "
                              "Triton, e.g. .deps/replay-py312/bin/python")
    argv = [str(python), "-m", "cache_tools.replay", *(str(f.absolute()) for f in files),
            "--cache-dir", str(cache_dir.absolute()), "--json"]
    if target:
        argv += ["--target", target]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    if dry_run:
        argv.append("--dry-run")
    env = dict(os.environ)
    # cache_tools is standard-library-only: appended, it cannot shadow that interpreter's
    # Triton or SGLang.
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=None, text=True,
                          check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise CacheError(f"the replay in {python} exited with status {done.returncode}",
                         hint="its error is printed above; run the same command with that "
                              "interpreter directly to see more")
    try:
        return ReplayReport.from_json(json.loads(done.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        raise CacheError(f"the replay in {python} printed no report: {exc}",
                         hint="does that interpreter run this version of sglang-warmup's "
                              "cache_tools?") from None


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------

def summary_line(report: ReplayReport) -> str:
    c = report.counts
    verb = "would rebuild" if report.dry_run else "rebuilt"
    count = c[PLANNED] if report.dry_run else c[REBUILT]
    text = (f"{count} {verb}, {c[PRESENT]} already present, {c[SKIPPED]} skipped, "
            f"{c[FAILED]} failed in {report.seconds:.1f} s into {report.cache_dir}")
    if report.skip_reasons:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in report.skip_reasons.items()) + ")"
    return text


def report_text(report: ReplayReport) -> str:
    """A table of every entry, then warnings and one summary sentence."""
    from cache_tools.render import table

    if not report.results:
        lines = [f"No Triton compile records in {', '.join(report.manifests)}"
                 + (f" ({report.ignored} other lines)" if report.ignored else "") + "."]
    else:
        rows = [[r.status, r.kernel, r.specialization, (r.hash or "-")[:12], r.target,
                 f"{r.seconds:.1f}s" if r.status in (REBUILT, FAILED) else "",
                 (f"{r.reason}: {r.detail}" if r.reason else r.detail)]
                for r in report.results]
        lines = [table(["STATUS", "KERNEL", "SPECIALIZATION", "KEY", "TARGET", "TIME", "WHY"],
                       rows)]
    lines += [f"warning: {w}" for w in report.warnings]
    lines.append(summary_line(report))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# python -m cache_tools.replay (what --python runs; standard library only)
# --------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cache_tools.replay",
        description="Rebuild Triton cache entries from a recorded compile manifest.")
    parser.add_argument("manifests", nargs="+")
    parser.add_argument("--cache-dir")
    parser.add_argument("--target")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    def progress(result: KernelResult, done: int, total: int) -> None:
        print(f"[{done}/{total}] {result.status} {result.kernel} "
              f"{(result.hash or '')[:12]}", file=sys.stderr, flush=True)

    try:
        report = replay(args.manifests, cache_dir=args.cache_dir, target=args.target,
                        jobs=args.jobs, dry_run=args.dry_run, on_result=progress)
    except CacheError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=1) if args.json else report_text(report))
    return 1 if report.count(FAILED) else 0


if __name__ == "__main__":
    sys.exit(main())
