"""The compile log: one JSON line per compile event, one append-only file per process.

Every SGLang process with the compile hooks installed appends to
``<state_dir>/compile_log/compiles-<pid>.jsonl``: Triton misses (with what a CPU replay needs),
disk-cache hits, device loads and nvcc JIT builds, each stamped with the phase it happened in.
This module is the log's one home: its location, the record fields and format version, the
writer, the readers (whole logs, or the bytes written between two marks) and the two rules
every consumer shares (what counts as compiled now, which kernel a record names).

Producers: ``warmup.observe`` (in the SGLang processes).  Consumers: the driver's per-class
counts, coverage, audit, the sidecar's second pass, ``cache replay``.  Standard library only.
State directories written before the log had this name hold ``manifest/`` instead of
``compile_log/``; the readers find both.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, TypedDict

from cache_tools import inputfile

logger = logging.getLogger("sglang_warmup.compile_log")

#: The directory under a state directory, the file names in it, and the record format.
DIR = "compile_log"
LEGACY_DIR = "manifest"
GLOB = "compiles-*.jsonl"
VERSION = 1

#: Record ``event`` values; each event's fields are its record type below.
MISS, HIT, LOAD, JIT_BUILD, GC = "miss", "hit", "load", "jit_build", "gc"
GEMM_SWEEP, ALLOCATOR = "gemm_sweep", "allocator"
EVENTS = (MISS, HIT, LOAD, JIT_BUILD, GC, GEMM_SWEEP, ALLOCATOR)
#: Events about one kernel or module (the ones grouped by compile key).
KERNEL_EVENTS = (MISS, HIT, LOAD, JIT_BUILD)
#: Events that compile or look up a compiled artifact (the ones coverage and audit count).
COMPILE_EVENTS = (MISS, HIT, JIT_BUILD)

#: A ``jit_build``'s ``outcome``: built now, reused from the library's cache, or failed.
BUILT, CACHED, FAILED = "built", "hit", "failed"
#: characters of a recompile's reason a ``jit_build`` record keeps, and a report shows
MAX_REASON = 512
JIT_OUTCOMES = (BUILT, CACHED, FAILED)

#: Who compiled (``compiler``; also the label of the compile metrics): Triton, SGLang's nvcc
#: JIT, a tvm-ffi build outside it, a library seen through its cache directory, or an
#: in-memory ``torch.compile`` graph.
TRITON, SGLANG_JIT, TVM_FFI, DYNAMO = "triton", "sglang_jit", "tvm_ffi", "dynamo"
#: Libraries whose builds are seen as new entries in their cache directories (the cache kinds
#: of :mod:`cache_tools.locations` of the same names).
LIBRARY_COMPILERS = ("deep_gemm", "tilelang", "flashinfer", "inductor", "cute_aot", "cute_dsl",
                     "flash_attn_4")
COMPILERS = (TRITON, SGLANG_JIT, TVM_FFI) + LIBRARY_COMPILERS + (DYNAMO,)
#: The ``compiler`` of the records that are no compile: a garbage collection, the GEMM sweep,
#: the allocator kept across the warm-up's flush.
PYTHON, CUBLAS, TORCH = "python", "cublas", "torch"


class KernelRef(TypedDict, total=False):
    """Which kernel a Triton record names: ``module``, ``name``, ``qualname``,
    ``source_sha256`` (of ``JITFunction.src``, checked by replay before any import), ``path``
    (an IR source), ``generated`` (a module made at run time: Inductor's kernels)."""

    module: str | None
    name: str | None
    qualname: str | None
    source_sha256: str
    path: str
    generated: bool


class BaseRecord(TypedDict):
    """The fields every record carries.  ``v``: the format version (absent in version-1 logs
    written before it was added); ``phase``: init, warmup or serving; ``shape_class`` and
    ``request``: the warm-up step in flight; ``compiler``: one of COMPILERS, PYTHON, CUBLAS or
    TORCH."""

    v: int
    event: str
    time: float
    pid: int
    phase: str
    shape_class: str | None
    request: int | None
    compiler: str


class TritonRecord(BaseRecord, total=False):
    """``miss`` (a Triton compile) and ``hit`` (a disk-cache load): what a rebuild needs."""

    kernel: KernelRef
    key: Any
    hash: str | None
    signature: dict[str, Any]
    constexprs: list[dict[str, Any]]
    attrs: list[dict[str, Any]]
    options: dict[str, Any]
    env: dict[str, Any]
    target: dict[str, Any] | None
    toolchain: dict[str, Any] | None
    triton_version: str | None
    duration_s: float | None
    stages: dict[str, Any] | None
    cache_hit: bool
    artifacts: list[str]
    cache_entry: str | None
    specialization: dict[str, Any] | None


class LoadRecord(BaseRecord, total=False):
    """``load``: a kernel's device load at its first launch in a process."""

    kernel: KernelRef
    hash: str
    duration_s: float | None
    free_bytes: int | None


class JitBuildRecord(BaseRecord, total=False):
    """``jit_build``: one build of a JIT module (``outcome`` one of JIT_OUTCOMES)."""

    outcome: str
    module_name: str | None
    duration_s: float | None
    path: str | None
    cache_hit: bool
    error: str
    reason: str     # why a graph was compiled again, as its compiler words it (MAX_REASON)


class GcRecord(BaseRecord, total=False):
    """``gc``: a long Python garbage collection (``time`` is when it ended)."""

    generation: int
    duration_s: float
    collected: int


class GemmSweepRecord(BaseRecord, total=False):
    """``gemm_sweep``: one scheduler's GEMM sweep after loading the model."""

    shapes: int
    calls: int
    rows_reached: int
    max_rows: int
    duration_s: float
    stopped_by_budget: bool
    capped_rows: int | None
    capped_shape: str | None
    failed: list[str]
    learned: int
    blas: str
    load_rows: dict[str, list[int]]


class AllocatorRecord(BaseRecord, total=False):
    """``allocator``: the warm-up's flush kept the caching allocator's blocks."""

    kept_bytes: int | None


#: The record type of each event: the log's schema (docs/metrics.md is checked against it).
RECORD_TYPES: dict[str, type] = {MISS: TritonRecord, HIT: TritonRecord, LOAD: LoadRecord,
                                 JIT_BUILD: JitBuildRecord, GC: GcRecord,
                                 GEMM_SWEEP: GemmSweepRecord, ALLOCATOR: AllocatorRecord}
BASE_FIELDS = tuple(BaseRecord.__annotations__)


def fields(event: str) -> tuple[str, ...]:
    """The fields an ``event`` record adds to the base fields."""
    return tuple(k for k in RECORD_TYPES[event].__annotations__ if k not in BASE_FIELDS)


def record(event: str, *, phase: str, shape_class: str | None, request: int | None,
           compiler: str) -> Any:
    """A new record of ``event`` with the base fields filled in (now, this process); the
    caller adds the fields of the event's record type."""
    return {"v": VERSION, "event": event, "time": time.time(), "pid": os.getpid(),
            "phase": phase, "shape_class": shape_class, "request": request, "compiler": compiler}


def is_miss(rec: Mapping[str, Any]) -> bool:
    """Something compiled now: a Triton miss or an nvcc JIT build."""
    event = rec.get("event")
    return event == MISS or (event == JIT_BUILD and rec.get("outcome") == BUILT)


def is_kept_miss(rec: Mapping[str, Any]) -> bool:
    """Something compiled now that a cache on disk keeps for the next process: a miss other
    than Dynamo's traces (they live in the process: every start traces again)."""
    return is_miss(rec) and rec.get("compiler") != DYNAMO


def is_compile_event(rec: Mapping[str, Any]) -> bool:
    """A compile, or a lookup of a compiled artifact (a disk hit, a cached JIT module)."""
    return rec.get("event") in COMPILE_EVENTS


def kernel_name(rec: Mapping[str, Any]) -> str:
    """The kernel (Triton) or module (nvcc JIT) a record names; ``?`` if none."""
    kernel = rec.get("kernel")
    if isinstance(kernel, dict):
        return str(kernel.get("name") or kernel.get("qualname") or "?")
    return str(rec.get("module_name") or kernel or "?")


# --- writing ------------------------------------------------------------------------------------
#: every live Writer, so that a forked child gives each a new lock
_WRITERS: "weakref.WeakSet[Writer]" = weakref.WeakSet()


def _new_locks_in_child() -> None:
    # A child forked while another thread of the parent was writing would wait for it forever.
    for writer in list(_WRITERS):
        writer._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


class Writer:
    """Appends records to ``<directory>/compiles-<pid>.jsonl``: O_APPEND, one ``write`` per
    line, so concurrent writers never interleave and a reader sees whole lines (but the last
    line of a killed process).  A forked child opens its own file.  ``default`` encodes values
    JSON does not know."""

    def __init__(self, directory: str | os.PathLike[str],
                 default: Callable[[Any], Any] | None = None) -> None:
        self.directory = Path(directory)
        self._default = default
        self._fd: int | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        _WRITERS.add(self)

    def write(self, rec: Mapping[str, Any]) -> None:
        data = (json.dumps(rec, default=self._default, separators=(",", ":")) + "\n").encode()
        with self._lock:
            pid = os.getpid()
            if self._fd is None or self._pid != pid:  # first line, or a forked child
                self.directory.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.directory / f"compiles-{pid}.jsonl",
                                   os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._pid = pid
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None and self._pid == os.getpid():
                try:
                    os.close(self._fd)
                except OSError:
                    pass
            self._fd = None


def directory(state_dir: str | os.PathLike[str]) -> Path:
    """Where the processes sharing ``state_dir`` write their logs."""
    return Path(state_dir) / DIR


# --- reading ------------------------------------------------------------------------------------
def files(state_dir: str | os.PathLike[str]) -> list[Path]:
    """The log files under a state directory (``compile_log/``, or the legacy ``manifest/``),
    sorted by name; none if there are none."""
    base = Path(state_dir)
    return sorted((base / DIR).glob(GLOB)) or sorted((base / LEGACY_DIR).glob(GLOB))


def find(path: str | os.PathLike[str]) -> list[Path]:
    """The log files ``path`` names: a log file itself, a directory of them, or a state
    directory above one; none if there are none."""
    p = Path(path)
    if p.is_file():
        return [p]
    return sorted(p.glob(GLOB)) or files(p)


#: One record's line at most (a Triton miss is a few KiB): a longer line is skipped, never held.
MAX_LINE_BYTES = 4 * 1024 * 1024


def lines(fh: Any, limit: int | None = None) -> Iterator[bytes | None]:
    """The lines of a binary file from where it stands (``limit``: bytes at most), each
    without its newline; None for a line longer than :data:`MAX_LINE_BYTES`, which is read
    past in pieces, never held whole."""
    left = limit
    while left is None or left > 0:
        want = MAX_LINE_BYTES + 1 if left is None else min(MAX_LINE_BYTES + 1, left)
        line = fh.readline(want)
        if not line:
            return
        if left is not None:
            left -= len(line)
        if line.endswith(b"\n") or len(line) <= MAX_LINE_BYTES:
            yield line.rstrip(b"\n")
            continue
        while line and not line.endswith(b"\n") and (left is None or left > 0):
            line = fh.readline(1 << 20 if left is None else min(1 << 20, left))
            if left is not None:
                left -= len(line)
        yield None


def parse_lines(data: bytes | Iterable[bytes | None], where: str = "", *,
                warnings: list[str] | None = None, first_line: int = 1) -> list[dict[str, Any]]:
    """The records in ``data`` (whole lines, or the lines :func:`lines` yields).  A line that
    is not a JSON object (the torn last line of a killed process), one longer than
    :data:`MAX_LINE_BYTES`, or one of a newer format version, is skipped; with ``warnings`` a
    sentence per skipped line is appended there."""
    out: list[dict[str, Any]] = []
    rows = data.splitlines() if isinstance(data, bytes) else data
    for number, line in enumerate(rows, start=first_line):
        if line is None:
            if warnings is not None:
                warnings.append(f"{where}:{number}: longer than {MAX_LINE_BYTES} bytes, skipped")
            continue
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict):
            if warnings is not None:
                warnings.append(f"{where}:{number}: not a JSON object, skipped")
            continue
        version = rec.get("v", 1)
        if not isinstance(version, int) or version > VERSION:
            if warnings is not None:
                warnings.append(f"{where}:{number}: compile-log format {version!r} is newer than "
                                f"this sglang-warmup reads ({VERSION}), skipped")
            continue
        out.append(rec)
    return out


def read(paths: Iterable[str | os.PathLike[str]], *, warnings: list[str] | None = None,
         by_time: bool = True) -> list[dict[str, Any]]:
    """Every record of the given log files: ordered by time (``by_time``), else in file and
    line order.  Unreadable files raise OSError (a FIFO or a device: ``not a regular file``)."""
    records: list[dict[str, Any]] = []
    for path in paths:
        with inputfile.open_regular(path) as fh:
            records.extend(parse_lines(lines(fh), str(path), warnings=warnings))
    if by_time:
        records.sort(key=_time)
    return records


def read_dir(state_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of every process's log under ``state_dir``, ordered by time; skipped
    lines are logged as warnings."""
    warnings: list[str] = []
    records = read(files(state_dir), warnings=warnings)
    for w in warnings:
        logger.warning("sglang-warmup: %s", w)
    return records


def _time(rec: Mapping[str, Any]) -> float:
    """A record's time for ordering; 0 for what is not a finite number (10**400 fits no float)."""
    t = rec.get("time")
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return 0.0
    try:
        return float(t) if math.isfinite(t) else 0.0
    except OverflowError:
        return 0.0


class Cursor:
    """Byte offsets into every log file of a state directory: the records written after
    :meth:`mark` are exactly the new bytes (the files are append-only, one ``write`` per line),
    whatever the processes' clocks say."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)

    def mark(self) -> dict[str, int]:
        """The current size of every log file."""
        out = {}
        for path in files(self.state_dir):
            try:
                out[str(path)] = path.stat().st_size
            except OSError:
                continue
        return out

    def read(self, start: Mapping[str, int], end: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
        """Records written between two marks (``end`` None: up to now), ordered by time.  A
        line being written right now is left for the next read."""
        records: list[dict[str, Any]] = []
        for path in files(self.state_dir):
            lo = start.get(str(path), 0)
            hi = None if end is None else end.get(str(path), 0)
            if hi is not None and hi <= lo:
                continue
            try:
                with inputfile.open_regular(path) as fh:
                    fh.seek(lo)
                    records.extend(parse_lines(lines(fh, None if hi is None else hi - lo),
                                               str(path)))
            except OSError as exc:
                logger.warning("sglang-warmup: cannot read %s: %s", path, exc)
                continue
        records.sort(key=_time)
        return records

