"""The run report: what one warm-up run sent per shape class, how long it took, what failed and
what compiled; frozen once the driver returns it, written as JSON and read back
(:meth:`RunReport.from_json`).  It is data only: ``warmup/view/`` renders it.

Layers above the driver (the second-pass check, the sidecar) build their own objects around a
:class:`RunReport` instead of changing it; :meth:`RunReport.with_compiles` returns a copy
counted over other compile-log records (e.g. those of one pass only).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from cache_tools import atomic
from cache_tools.compile_log import ALLOCATOR, GEMM_SWEEP, HIT, JIT_BUILD, is_miss, kernel_name

#: The run report's JSON format and version (``sglang-warmup report`` reads them).
FORMAT = "sglang-warmup-run"
VERSION = 1
#: one start's schedulers sweep within this many seconds of each other (see _this_lifetime)
SWEEP_WINDOW_S = 120.0
#: what the report keeps of each ``gemm_sweep`` compile-log record
_SWEEP_FIELDS = ("pid", "shapes", "calls", "rows_reached", "max_rows", "duration_s",
                 "stopped_by_budget", "capped_rows", "capped_shape", "failed", "learned", "blas",
                 "load_rows")

#: the most a run report file may hold when read back (the largest shipped plan's is ~100 KiB)
MAX_REPORT_BYTES = 64 * 1024 * 1024


@dataclass
class _Tally:
    """One class's warm-up compiles while RunReport.with_compiles counts them."""
    compiles: int = 0
    jit_builds: int = 0
    disk_hits: int = 0
    kernels: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ClassReport:
    """Per shape class: what was sent, how long it took, what failed, what compiled.

    ``compiles``: Triton misses stamped with this class during the warm-up (from the compile
    log); ``jit_builds``: nvcc/tvm-ffi builds; ``disk_hits``: loads from the disk cache;
    ``kernels``: distinct names of what compiled; ``errors``: one line per failed step.
    ``repeat_ms``: with a driver that repeats every step (the second pass), the repeats' time;
    ``worst_step_ratio``: the largest first/repeat ratio of one step.
    """

    shape_class: str
    phase: str
    kind: str
    steps: int = 0
    requests: int = 0
    failures: int = 0
    total_ms: float = 0.0
    max_step_ms: float = 0.0
    compiles: int = 0
    disk_hits: int = 0
    jit_builds: int = 0
    kernels: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    repeat_ms: float = 0.0
    worst_step_ratio: float = 0.0

    @property
    def ms_per_request(self) -> float:
        return self.total_ms / self.requests if self.requests else 0.0

    @property
    def first_hit_ratio(self) -> float | None:
        """First sends over repeats (None when the steps were not repeated)."""
        return self.total_ms / self.repeat_ms if self.repeat_ms > 0 else None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ClassReport":
        """A class read back from a saved report (someone else's bytes: a count or a time that
        is not a finite number reads as 0, a name that is not text as its text).  A report
        written before ``repeat_ms`` keeps its ``first_hit_ratio``."""
        total = as_number(d.get("total_ms"))
        repeat = as_number(d.get("repeat_ms"))
        ratio = as_number(d.get("first_hit_ratio"))
        if not repeat and ratio > 0:
            repeat = total / ratio
        return cls(shape_class=_text(d.get("shape_class")), phase=_text(d.get("phase")),
                   kind=_text(d.get("kind")), steps=_count(d.get("steps")),
                   requests=_count(d.get("requests")), failures=_count(d.get("failures")),
                   total_ms=total, max_step_ms=as_number(d.get("max_step_ms")),
                   compiles=_count(d.get("compiles")), disk_hits=_count(d.get("disk_hits")),
                   jit_builds=_count(d.get("jit_builds")), kernels=_texts(d.get("kernels")),
                   errors=_texts(d.get("errors")), repeat_ms=repeat,
                   worst_step_ratio=as_number(d.get("worst_step_ratio")))


@dataclass(frozen=True)
class RunReport:
    """The outcome of one warm-up run (JSON via :meth:`to_dict`, read back by :meth:`from_json`;
    text and HTML in ``warmup/view/``).

    ``skipped_reason``: why nothing was sent (PD disaggregation); ``flush``: the flush's answer;
    ``skipped``: items the expansion left out; ``failures``: one line per failed step or flush;
    ``compiles_by_phase``: compile misses per phase over the records counted;
    ``gemm_sweeps``: each scheduler's GEMM sweep after loading the model (its ``gemm_sweep``
    record's fields and ``pid``); ``allocator_kept``: each scheduler whose caching allocator
    kept its blocks across this run's flush (``pid``, ``kept_bytes``); ``warnings``: what the
    expansion and the launch's checks found that no plan class warms (a JIT precompile turned
    off, a family named but absent); ``step_ms``: each sent step's first send, ``(index, ms)``
    (failed steps left out); ``quiet_steps``: steps not sent because a steps record
    (``steps_record``: which, and what it learned) found them quiet when the cache was baked.
    """

    plan: str
    plan_sha256: str
    expansion_digest: str
    transport: str
    started_at: float
    ok: bool = True
    skipped_reason: str | None = None
    duration_s: float = 0.0
    flush: str | None = None
    classes: tuple[ClassReport, ...] = ()
    skipped: tuple[Mapping[str, str], ...] = ()
    failures: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    compiles_total: int = 0
    compiles_by_phase: Mapping[str, int] = field(default_factory=dict)
    gemm_sweeps: tuple[Mapping[str, Any], ...] = ()
    allocator_kept: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    step_ms: tuple[tuple[int, float], ...] = ()
    quiet_steps: int = 0
    steps_record: str = ""

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self.classes)

    @property
    def requests_ok(self) -> int:
        return sum(c.requests - c.failures for c in self.classes)

    @property
    def requests_failed(self) -> int:
        return sum(c.failures for c in self.classes)

    def with_compiles(self, records: Iterable[Mapping[str, Any]]) -> "RunReport":
        """A copy whose compile counts come from ``records`` (compile-log records): per phase,
        and per class for the warm-up's own (``compiles``, ``jit_builds``, ``disk_hits``,
        kernel names).  Earlier counts are replaced, not added to."""
        tallies = {c.shape_class: _Tally() for c in self.classes}
        by_phase: dict[str, int] = {}
        total = 0
        sweeps, kept = [], []
        for r in records:
            if r.get("event") == GEMM_SWEEP:
                sweeps.append(r)
                continue
            if r.get("event") == ALLOCATOR:     # this run's flush, not an earlier start's
                if as_number(r.get("time")) >= self.started_at:
                    kept.append({"pid": r.get("pid"), "kept_bytes": r.get("kept_bytes")})
                continue
            t = tallies.get(r.get("shape_class") or "")
            if not is_miss(r):
                if r.get("event") == HIT and t is not None:
                    t.disk_hits += 1
                continue
            ph = r.get("phase") or "init"
            by_phase[ph] = by_phase.get(ph, 0) + 1
            total += 1
            if t is None or ph != "warmup":
                continue
            if r.get("event") == JIT_BUILD:
                t.jit_builds += 1
            else:
                t.compiles += 1
            name = kernel_name(r)
            if name not in t.kernels:
                t.kernels.append(name)
        classes = tuple(replace(c, compiles=tallies[c.shape_class].compiles,
                                jit_builds=tallies[c.shape_class].jit_builds,
                                disk_hits=tallies[c.shape_class].disk_hits,
                                kernels=tuple(tallies[c.shape_class].kernels))
                        for c in self.classes)
        return replace(self, classes=classes, compiles_total=total, compiles_by_phase=by_phase,
                       gemm_sweeps=_this_lifetime(sweeps), allocator_kept=tuple(kept))

    def to_dict(self) -> dict[str, Any]:
        """JSON: the format and its version, every field (tuples as lists), plus ``requests``
        and per class ``ms_per_request`` and ``first_hit_ratio``."""
        d = {"format": FORMAT, "version": VERSION, **_plain(asdict(self))}
        d["step_ms"] = [[i, round(ms, 2)] for i, ms in self.step_ms]
        d["requests"] = self.requests
        for c, cd in zip(self.classes, d["classes"]):
            cd["ms_per_request"] = round(c.ms_per_request, 2)
            ratio = c.first_hit_ratio
            cd["first_hit_ratio"] = None if ratio is None else round(ratio, 3)
        return d

    def write(self, path: str | Path) -> None:
        write_json(self.to_dict(), path)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RunReport":
        """A report read back from its JSON (:meth:`to_dict`, or a file written before the
        format marker).  Lenient as the views need it: a field of the wrong type reads as
        empty, a number that is not finite as 0; the classes must be objects (the caller checks
        that, naming the file)."""
        phases = d.get("compiles_by_phase")
        by_phase = {str(k): _count(v) for k, v in phases.items()} \
            if isinstance(phases, Mapping) else {}
        return cls(plan=_text(d.get("plan")), plan_sha256=_text(d.get("plan_sha256")),
                   expansion_digest=_text(d.get("expansion_digest")),
                   transport=_text(d.get("transport")) or "?",
                   started_at=as_number(d.get("started_at")), ok=bool(d.get("ok", True)),
                   skipped_reason=None if d.get("skipped_reason") is None
                   else _text(d.get("skipped_reason")),
                   duration_s=as_number(d.get("duration_s")),
                   flush=None if d.get("flush") is None else _text(d.get("flush")),
                   classes=tuple(ClassReport.from_json(c) for c in _maps(d.get("classes"))),
                   skipped=tuple({str(k): _text(v) for k, v in m.items()}
                                 for m in _maps(d.get("skipped"))),
                   failures=_texts(d.get("failures")),
                   facts=dict(d["facts"]) if isinstance(d.get("facts"), Mapping) else {},
                   compiles_total=_count(d.get("compiles_total")), compiles_by_phase=by_phase,
                   gemm_sweeps=tuple(_maps(d.get("gemm_sweeps"))),
                   allocator_kept=tuple(_maps(d.get("allocator_kept"))),
                   warnings=_texts(d.get("warnings")), step_ms=_step_ms(d.get("step_ms")),
                   quiet_steps=_count(d.get("quiet_steps")),
                   steps_record=_text(d.get("steps_record")))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(map(str, value)) if isinstance(value, list) else ()


def _count(value: Any) -> int:
    return int(as_number(value))


def _step_ms(value: Any) -> tuple[tuple[int, float], ...]:
    """The ``[index, ms]`` pairs of a saved report (anything else: left out)."""
    if not isinstance(value, list):
        return ()
    return tuple((int(p[0]), as_number(p[1])) for p in value
                 if isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                 and not isinstance(p[0], bool) and 0 <= p[0] < 1 << 31)


def _maps(value: Any) -> list[Mapping[str, Any]]:
    """The objects of a list field (anything else: none)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def write_json(document: Mapping[str, Any], path: str | Path) -> None:
    """Write a report document as indented JSON, replacing the file in one step."""
    atomic.write_text(path, json.dumps(document, indent=2, default=str) + "\n")


def _plain(value: Any) -> Any:
    """``asdict`` output with tuples as lists and mappings as dicts (JSON's shapes)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _this_lifetime(records: list[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """The sweeps of the server's latest start: a state directory kept across restarts holds
    earlier ones too, minutes or more before; one start's schedulers sweep within
    ``SWEEP_WINDOW_S`` of each other."""
    times = [r.get("time") for r in records]
    if not records or not all(isinstance(t, (int, float)) for t in times):
        return tuple({k: r.get(k) for k in _SWEEP_FIELDS} for r in records)
    latest = max(times)  # type: ignore[type-var]
    return tuple({k: r.get(k) for k in _SWEEP_FIELDS} for r, t in zip(records, times)
                 if t >= latest - SWEEP_WINDOW_S)  # type: ignore[operator]


def as_number(value: Any) -> float:
    """A number read from a saved document: its value, or 0 for anything that is not a finite
    number (the views read reports that may be damaged or hostile: an integer of 400 digits
    does not fit a float)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    try:
        number = float(value)
    except OverflowError:
        return 0.0
    return number if math.isfinite(number) else 0.0


def sweep_processes(sweeps: Iterable[Any]) -> list[dict[str, Any]]:
    """The GEMM sweeps per scheduler process (a draft runner's sweep is its process's second
    record: merged), longest first.  Also for a saved report, so anything that is not a number
    reads as 0."""
    procs: dict[Any, dict[str, Any]] = {}
    for i, s in enumerate(x for x in sweeps if isinstance(x, Mapping)):
        pid = s.get("pid") if isinstance(s.get("pid"), int) else f"record {i}"
        p = procs.setdefault(pid, {"shapes": 0.0, "duration_s": 0.0, "rows_reached": 0.0,
                                   "max_rows": 0.0, "cut": False, "capped": None,
                                   "failed": 0, "learned": 0.0})
        p["shapes"] += as_number(s.get("shapes"))
        p["learned"] += as_number(s.get("learned"))
        p["duration_s"] += as_number(s.get("duration_s"))
        p["rows_reached"] = max(p["rows_reached"], as_number(s.get("rows_reached")))
        p["max_rows"] = max(p["max_rows"], as_number(s.get("max_rows")))
        p["cut"] = p["cut"] or s.get("stopped_by_budget") is True
        p["failed"] += len(s["failed"]) if isinstance(s.get("failed"), list) else 0
        if as_number(s.get("capped_rows")) and isinstance(s.get("capped_shape"), str):
            capped = (as_number(s.get("capped_rows")), (s["capped_shape"].split() or ["?"])[0])
            p["capped"] = min(p["capped"], capped) if p["capped"] else capped
    return sorted(procs.values(), key=lambda p: -p["duration_s"])


def allocator_kept(kept: Any) -> tuple[int, float]:
    """The schedulers whose caching allocator kept its blocks across the warm-up's flush (those
    whose record the report read: another tensor-parallel rank may finish its flush a moment
    after the first answered), and the most bytes one of them kept.  Also for a saved report:
    anything that is not a list of records counts as none, a size that is not a number as 0."""
    records = [k for k in kept if isinstance(k, Mapping)] if isinstance(kept, (list, tuple)) \
        else []
    return len(records), max((as_number(k.get("kept_bytes")) for k in records), default=0.0)
